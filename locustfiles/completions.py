"""Streaming /v1/completions load: `locust -f locustfiles/completions.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.

The same file ships in the package (vllm_load/locustfiles/completions.py): `locust -f "$(vllm-load locustfile completions)"`.
"""

from vllm_load.locustfiles.completions import *  # noqa: F401,F403  (Locust collects the classes of this module)
