"""/v1/rerank load (a pooling model: vLLM's --runner pooling): `locust -f locustfiles/rerank.py [--host URL] [--batch-size N]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.
"""

from vllm_load.plugin.load.users import RerankUser  # noqa: F401  (Locust collects the User classes of this module)
