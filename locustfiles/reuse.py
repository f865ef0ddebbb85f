"""Shipped locustfile: `locust -f locustfiles/reuse.py` (see its docstring in vllm_load/locustfiles/reuse.py).

The same file ships in the package: `locust -f "$(vllm-load locustfile reuse)"`.
"""

from vllm_load.locustfiles.reuse import *  # noqa: F401,F403  (Locust collects the classes of this module)
