"""A sweep over concurrency (or request rate) levels, one step per level: see vllm_load/plugin/lifecycle/shapes.py.

    locust -f locustfiles/sweep.py --headless --sweep 8,16,32,64 --step-duration 30 --slo 'ttft.p99<=1s'
"""

from vllm_load.plugin.lifecycle.shapes import SweepShape  # noqa: F401  (Locust uses the shape class of this module)
from vllm_load.plugin.load.users import ChatUser  # noqa: F401
