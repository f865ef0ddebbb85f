"""This process's part in vllm-load: one object per Locust role, as Locust's own LocalRunner, MasterRunner and
WorkerRunner are (``roles.py`` makes it at init). Each registers its listeners and custom messages when made and
removes them in ``close()``; nothing branches on the role. Users find it through their environment."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

import gevent.event
import gevent.ssl

from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.prepare.plan import ramp_kind
from vllm_load.plugin.lifecycle.run import Run

log = logging.getLogger("vllm_load")

#: the Locust environment's attribute that holds its process (one environment per process)
ATTR = "vllm_load_process"


class Process:
    """What lives as long as this Locust process; its current (or last) run in ``run``."""

    role = ""  # Locust's name for the role ("local", "master", "worker"): log filters and file names

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.opts = environment.parsed_options
        self.run: Run | None = None
        self._listening: list[tuple[Any, Callable]] = []
        self._messages: list[str] = []
        setattr(environment, ATTR, self)
        events = environment.events
        self.listen(events.reset_stats, self._on_reset_stats)
        self.listen(events.spawning_complete, self._on_spawning_complete)
        self.listen(events.quitting, self._on_quitting)

    # -- registration, undone by close() --------------------------------------------------------------
    def listen(self, event: Any, handler: Callable) -> None:
        event.add_listener(handler)
        self._listening.append((event, handler))

    def on_message(self, name: str, handler: Callable[[Any], None], concurrent: bool = False) -> None:
        """A custom message of the master <-> worker wire, handled with its data (``msg``)."""
        self.environment.runner.register_message(name, lambda msg, **_kw: handler(msg), concurrent=concurrent)
        self._messages.append(name)

    def close(self) -> None:
        for event, handler in self._listening:
            event.remove_listener(handler)
        for name in self._messages:  # Locust refuses a second listener for a message: a new process may register
            self.environment.runner.custom_messages.pop(name, None)
        self._listening, self._messages = [], []
        if self.run is not None:
            self.run.close()
        setattr(self.environment, ATTR, None)

    # -- the role's own parts -------------------------------------------------------------------------
    def start_up(self) -> None:
        """At Locust's init, after the listeners are registered: what this role checks and starts once."""

    def start_run(self) -> None:
        """Locust's test_start: the run's plan and parts."""
        raise NotImplementedError

    @property
    def generator(self) -> Generator | None:
        return self.run.generator if self.run is not None else None

    def reset_metrics(self) -> None:
        """The LLM metrics start over with Locust's table (the web UI's Reset button)."""
        self._reset_own()

    def _reset_own(self) -> None:
        """This process's own LLM metrics start over."""
        if self.run is not None:
            for part in (self.run.generator, self.run.collector):
                if part is not None:
                    part.reset_metrics()

    def _on_reset_stats(self, **_kw: Any) -> None:
        """The web UI's Reset button."""
        self.reset_metrics()

    def _on_spawning_complete(self, **_kw: Any) -> None:
        """Every user is spawned (a master passes Locust's event on to its workers): the steady window opens here.
        --reset-stats: Locust resets every runner's own table now; ours go with it."""
        gen = self.generator
        if gen is not None:
            gen.steady.open(time.time())
        if self.environment.reset_stats:
            self._reset_own()

    def drain_or_cut(self, gen: Generator, timeout: float, cut: gevent.event.Event) -> None:
        """The end's drain (at most ``timeout``), cut short by ``cut`` (a second Ctrl-C): the users still in a request
        are then stopped here, so their requests are recorded as cancelled (counted failed, as at the drain's
        timeout) before the final numbers are made, not after them (Locust stops its users once the end is written)."""
        if gen.drain(timeout, cut=cut):
            return
        if cut.is_set():
            self.environment.runner.user_greenlets.kill(block=True, timeout=10)
            gen.flush_log()
        else:
            log.warning("vllm-load: %d requests still in flight after the drain timeout", gen.in_flight)

    def _on_quitting(self, **_kw: Any) -> None:
        self._close_run()

    def _close_run(self) -> None:
        if self.run is not None:
            self.run.close()

    def apis(self) -> frozenset[str]:
        """The APIs the run's user classes send ("chat", "completions")."""
        return frozenset(a for a in (getattr(c, "api", None) for c in self.environment.user_classes) if a)

    def configure_users(self) -> None:
        """The run's options on Locust's user classes, before its users are made."""
        opts = self.opts
        for cls in self.environment.user_classes:
            cls.network_timeout = float(opts.request_timeout)
            # Locust's FastHttpUser skips certificate checks unless told: vllm-load verifies unless --insecure
            cls.insecure = bool(opts.insecure)
            if opts.ca_bundle and not opts.insecure:
                cls.ssl_context_factory = functools.partial(_ca_bundle_context, opts.ca_bundle)
            if opts.request_rate > 0 or opts.trace or opts.rate_schedule or ramp_kind(opts) == "rate":  # open loop: one user, many streams
                cls.concurrency = max(1, int(opts.max_concurrency))


def process_of(environment: Any) -> Process | None:
    return getattr(environment, ATTR, None)


def generator_of(environment: Any) -> Generator | None:
    """What generates this process's load now (None before a run, on a master, or when the target failed)."""
    process = getattr(environment, ATTR, None)
    run = process.run if process is not None else None
    return run.generator if run is not None else None


def _ca_bundle_context(ca_bundle: str, cafile: Any = None, **_kw: Any) -> Any:
    """geventhttpclient passes its own CA file (certifi's): --ca-bundle's is the one that counts."""
    return gevent.ssl.create_default_context(cafile=ca_bundle)
