"""Streaming /v1/messages load (Anthropic's Messages API, as vLLM serves it): `locust -f locustfiles/messages.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.

The same file ships in the package (vllm_load/locustfiles/messages.py): `locust -f "$(vllm-load locustfile messages)"`.
"""

from vllm_load.locustfiles.messages import *  # noqa: F401,F403  (Locust collects the classes of this module)
