"""The plugin's import-time hooks on ``locust.events`` (importing the users module registers them, the way Locust's
own plugins do): its options, and at init the object of this process's role (``roles.py``), which registers the
rest. A worker's test_start waits here for that object: a worker joining a running swarm gets its spawn message
while Locust still builds its runner, before init."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
from locust import events

from vllm_load import options
from vllm_load.plugin import interrupt, log_repeats, ports, roles, ui_guard
from vllm_load.plugin.process import Process

#: this process's object, once Locust's init made it
_PROCESS: gevent.event.AsyncResult = gevent.event.AsyncResult()
log_repeats.quiet_early()  # Locust's web UI line, logged before init: the controller says it when the port answers


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_kw: Any) -> None:
    options.add_arguments(parser)
    # Locust's web UI and master listen on every interface unless told: vllm-load's on this host only (workers on
    # other machines need --master-bind-host given, and the master says its port is unauthenticated)
    parser.set_defaults(web_host=ui_guard.DEFAULT_WEB_HOST, master_bind_host=ui_guard.DEFAULT_WEB_HOST)
    parse = parser.parse_args

    def parse_args(*args: Any, **kw: Any) -> Any:
        options = parse(*args, **kw)
        ports.settle(options)  # before Locust's runner binds (or forks workers onto) the master's port
        return options

    parser.parse_args = parse_args


@events.init.add_listener
def _on_init(environment: Any, **_kw: Any) -> None:
    log_repeats.install()
    interrupt.install()
    process = roles.make(environment)
    log_repeats.quiet(process.role)
    process.start_up()
    _PROCESS.set(process)


@events.test_start.add_listener
def _on_test_start(environment: Any, **_kw: Any) -> None:
    # the runner's constructor and init go on in the main greenlet meanwhile (seen: 2 joins in 6 sent nothing)
    try:
        process: Process = _PROCESS.get(timeout=60.0)
    except gevent.Timeout:
        raise RuntimeError("vllm-load: Locust's init did not come within 60 s of this worker's first spawn") from None
    process.start_run()
