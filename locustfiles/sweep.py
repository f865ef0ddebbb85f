"""A sweep over concurrency (or request rate) levels, one step per level: see vllm_load/plugin/lifecycle/shapes.py.

    locust -f locustfiles/sweep.py --headless --sweep 8,16,32,64 --step-duration 30 --slo 'ttft.p99<=1s'

The same file ships in the package (vllm_load/locustfiles/sweep.py): `locust -f "$(vllm-load locustfile sweep)"`.
"""

from vllm_load.locustfiles.sweep import *  # noqa: F401,F403  (Locust collects the classes of this module)
