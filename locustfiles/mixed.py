"""Shipped locustfile: `locust -f locustfiles/mixed.py` (see its docstring in vllm_load/locustfiles/mixed.py).

The same file ships in the package: `locust -f "$(vllm-load locustfile mixed)"`.
"""

from vllm_load.locustfiles.mixed import *  # noqa: F401,F403  (Locust collects the classes of this module)
