"""/v1/rerank load (a pooling model: vLLM's --runner pooling): `locust -f locustfiles/rerank.py [--host URL] [--batch-size N]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.

The same file ships in the package (vllm_load/locustfiles/rerank.py): `locust -f "$(vllm-load locustfile rerank)"`.
"""

from vllm_load.locustfiles.rerank import *  # noqa: F401,F403  (Locust collects the classes of this module)
