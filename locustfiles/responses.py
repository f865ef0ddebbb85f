"""Streaming /v1/responses load (the Responses API, how gpt-oss is best served): `locust -f locustfiles/responses.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.

The same file ships in the package (vllm_load/locustfiles/responses.py): `locust -f "$(vllm-load locustfile responses)"`.
"""

from vllm_load.locustfiles.responses import *  # noqa: F401,F403  (Locust collects the classes of this module)
