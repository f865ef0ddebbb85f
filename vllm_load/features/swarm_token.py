"""An authenticated swarm's option (the mechanism, ZeroMQ CURVE on Locust's sockets, is ``plugin/swarm/swarm_auth.py``:
only the plugin touches Locust). A master and its workers given the same token talk over CURVE; a peer without it
never reaches the run."""

from __future__ import annotations

from vllm_load.feature_spec import Feature
from vllm_load.option_spec import Option, group


class SwarmToken(Feature):
    name = "swarm_token"
    parts = ("plugin/swarm/swarm_auth.py",)
    options = group(
        "distributed",
        Option("--swarm-token-file", "", "a swarm's shared secret: master and every worker read this file (or "
               "VLLM_LOAD_SWARM_TOKEN) and talk over ZeroMQ CURVE; a peer without it cannot join, report or stop the "
               "run, and the master names each one it refused (--processes makes one of its own)", web=False),
    )


FEATURE = SwarmToken()
