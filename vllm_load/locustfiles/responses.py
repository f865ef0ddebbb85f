"""Streaming /v1/responses load (the Responses API, how gpt-oss is best served): `locust -f locustfiles/responses.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.
"""

from vllm_load.plugin.load.users import ResponsesUser  # noqa: F401  (Locust collects the User classes of this module)
