"""Streaming /v1/completions load: `locust -f locustfiles/completions.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.
"""

from vllm_load.plugin.load.users import CompletionsUser  # noqa: F401  (Locust collects the User classes of this module)
