"""The plugin's import-time hooks on ``locust.events`` (importing the users module registers them, the way Locust's
own plugins do): its options, and at init the object of this process's role (``roles.py``), which registers the
rest. ``attach`` puts the same init and test_start hooks on any environment's events: Locust's own for the command
line, each environment's own in ``vllm_load.testing`` (a master and its workers in one process). A worker's
test_start waits for its object: a worker joining a running swarm gets its spawn message while Locust still builds
its runner, before init."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
from locust import events

from vllm_load import options
from vllm_load.plugin.lifecycle import interrupt, log_repeats, roles
from vllm_load.plugin.prepare import parsed
from vllm_load.plugin.webui import ui_guard
from vllm_load.plugin.lifecycle.process import Process

#: the environment's attribute that holds the AsyncResult of its process object, once its init made it
READY = "vllm_load_ready"
log_repeats.quiet_early()  # Locust's web UI line, logged before init: the controller says it when the port answers


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_kw: Any) -> None:
    options.add_arguments(parser)
    # Locust's web UI and master listen on every interface unless told: vllm-load's on this host only (workers on
    # other machines need --master-bind-host given, and the master says its port is unauthenticated)
    parser.set_defaults(web_host=ui_guard.DEFAULT_WEB_HOST, master_bind_host=ui_guard.DEFAULT_WEB_HOST)
    parse = parser.parse_args

    def parse_args(*args: Any, **kw: Any) -> Any:
        return parsed.settle(parse(*args, **kw))

    parser.parse_args = parse_args


def _ready(environment: Any) -> gevent.event.AsyncResult:
    """The environment's process object, to come (its init and its first spawn message race in a worker)."""
    ready = getattr(environment, READY, None)
    if ready is None:
        ready = gevent.event.AsyncResult()
        setattr(environment, READY, ready)
    return ready


def _on_init(environment: Any, **_kw: Any) -> None:
    log_repeats.install()
    interrupt.install()
    process = roles.make(environment)
    log_repeats.quiet(process.role)
    process.start_up()
    _ready(environment).set(process)


def _on_test_start(environment: Any, **_kw: Any) -> None:
    # the runner's constructor and init go on in the main greenlet meanwhile (seen: 2 joins in 6 sent nothing)
    try:
        process: Process = _ready(environment).get(timeout=60.0)
    except gevent.Timeout:
        raise RuntimeError("vllm-load: Locust's init did not come within 60 s of this worker's first spawn") from None
    process.start_run()


def attach(hooks: Any) -> None:
    """The plugin's init and test_start hooks on an environment's events (Locust's global ones at import)."""
    hooks.init.add_listener(_on_init)
    hooks.test_start.add_listener(_on_test_start)


attach(events)
