"""Streaming /v1/messages load (Anthropic's Messages API, what agents built on Anthropic's SDK send to vLLM):
`locust -f locustfiles/messages.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.
"""

from vllm_load.plugin.load.users import MessagesUser  # noqa: F401  (Locust collects the User classes of this module)
