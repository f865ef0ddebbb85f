"""Shipped locustfile: `locust -f locustfiles/multiturn.py` (see its docstring in vllm_load/locustfiles/multiturn.py).

The same file ships in the package: `locust -f "$(vllm-load locustfile multiturn)"`.
"""

from vllm_load.locustfiles.multiturn import *  # noqa: F401,F403  (Locust collects the classes of this module)
