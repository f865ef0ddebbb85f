"""Shipped locustfile: `locust -f locustfiles/sessions.py` (see its docstring in vllm_load/locustfiles/sessions.py).

The same file ships in the package: `locust -f "$(vllm-load locustfile sessions)"`.
"""

from vllm_load.locustfiles.sessions import *  # noqa: F401,F403  (Locust collects the classes of this module)
