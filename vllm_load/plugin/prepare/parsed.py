"""What is settled the moment Locust has parsed the options: before its runner binds or connects a socket, before
``--processes`` forks its workers, before its logging holds the console's streams."""

from __future__ import annotations

from typing import Any

from vllm_load import redact
from vllm_load.plugin.prepare import ports
from vllm_load.plugin.swarm import swarm_auth, worker_secrets


def settle(options: Any) -> Any:
    """``options``, settled in place (and returned, as Locust's ``parse_args`` returns them)."""
    ports.settle(options)  # before Locust's runner binds (or forks workers onto) the master's port
    # decided before the fork, which makes every --processes child a worker: a master's own workers leave the
    # terminal's process group (plugin/lifecycle/worker.py); a --worker host's parent waits for its children to take Ctrl-C
    options.workers_of_this_master = bool(getattr(options, "processes", 0)) and not getattr(options, "worker", False)
    swarm_auth.settle(options)  # the swarm's keys, before any socket and before the fork
    worker_secrets.mask_repr(options)  # no repr of the options shows a secret (gevent prints greenlets' arguments)
    worker_secrets.register(options)
    redact.guard_streams()  # the console masks them too: a server's words, Locust's log, a traceback
    return options
