"""Shipped locustfile: `locust -f locustfiles/agent.py` (see its docstring in vllm_load/locustfiles/agent.py).

The same file ships in the package: `locust -f "$(vllm-load locustfile agent)"`.
"""

from vllm_load.locustfiles.agent import *  # noqa: F401,F403  (Locust collects the classes of this module)
