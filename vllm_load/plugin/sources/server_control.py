"""Putting the server in a known state between measurements, and looking inside it at one: vLLM's
``POST /reset_prefix_cache`` and its profiler's ``POST /start_profile`` / ``/stop_profile``.

Without a reset, a sweep's step, a tune's probe or a repeated run inherits the prefix cache the last one filled, and
its hit rate (and so its TTFT) describes the order of the measurements. vLLM serves the reset only in dev mode
(``VLLM_SERVER_DEV_MODE=1``) and the profiler only when started with ``--profiler-config``; a server that refuses
either is said once, and the run goes on.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any, Callable, NamedTuple

from vllm_load.client.apis.openai_api import auth_header, public_url
from vllm_load.errors import UsageError

PATH = "/reset_prefix_cache"
START, STOP = "/start_profile", "/stop_profile"
#: how long a profiler's stop may take: vLLM writes the trace before it answers (seconds on a GPU server)
STOP_TIMEOUT_S = 120.0


class _Control:
    """POSTs to every target; a target that refuses an endpoint (HTTP error) is said once and left out after."""

    def __init__(self, hosts: tuple[str, ...], api_key: str, say: Callable[[str], None]) -> None:
        self.hosts, self.api_key, self.say = hosts, api_key, say
        self.refused: set[str] = set()

    def _post(self, path: str, why: str, hint: str, timeout: float = 10.0) -> int:
        done = 0
        for host in self.hosts:
            if host in self.refused:
                continue
            req = urllib.request.Request(host.rstrip("/") + path, data=b"", method="POST",
                                         headers=auth_header(self.api_key))
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    resp.read()
                done += 1
            except urllib.error.HTTPError as exc:
                self.refused.add(host)
                self.say(f"vllm-load: {public_url(host)} refused {path} (HTTP {exc.code}; {hint})")
            except OSError as exc:
                self.say(f"vllm-load: {path} at {public_url(host)} failed {why}: {exc}")
        return done


class CacheReset(_Control):
    """--reset-prefix-cache for one process's runs: every target's cache emptied before each measurement."""

    def __call__(self, why: str) -> int:
        """Reset every target that takes it; the number that did."""
        done = self._post(PATH, f"before {why}", "vLLM serves it with VLLM_SERVER_DEV_MODE=1): its prefix cache "
                          "is not reset between measurements")
        if done:
            self.say(f"vllm-load: prefix cache reset on {done} target(s) before {why}")
        return done


class ProfileAt(NamedTuple):
    """--profile-at, read once: ``kind`` "running" (``value``: the server's running requests that start it), "run"
    (the measured window) or "step" (``value``: the sweep level whose first step is profiled)."""

    kind: str
    value: float = 0.0


def parse_profile_at(value: str, sweep_levels: tuple[float, ...] | None) -> ProfileAt | None:
    """--profile-at: None (off), N running requests, "run", or "step:LEVEL" (a level the sweep has)."""
    text = str(value or "").strip()
    if not text:
        return None
    if text == "run":
        return ProfileAt("run")
    if text.isdigit() and int(text) >= 1:
        return ProfileAt("running", float(text))
    kind, _, level_text = text.partition(":")
    try:
        level = float(level_text) if kind == "step" else None
    except ValueError:
        level = None
    if level is None:
        raise UsageError(f"--profile-at {text!r}: give N (the server's running requests, e.g. 32), 'run' (the measured "
                         "window) or, with --sweep, step:LEVEL")
    if sweep_levels is None:
        raise UsageError(f"--profile-at {text}: step:LEVEL profiles a sweep's step: run locustfiles/sweep.py --sweep")
    if level not in sweep_levels:
        raise UsageError(f"--profile-at {text}: the sweep has no step at {level:g} (its levels: "
                         f"{', '.join(f'{v:g}' for v in dict.fromkeys(sweep_levels))})")
    return ProfileAt("step", level)


def profile_point(opts: object) -> ProfileAt | None:
    """The run's --profile-at, read against its sweep's levels (a run with no --sweep has none)."""
    from vllm_load.plugin.lifecycle.sweep import SweepSpec

    spec = SweepSpec.of(opts)
    return parse_profile_at(str(getattr(opts, "profile_at", "") or ""), spec.levels if spec is not None else None)


class Profiler(_Control):
    """--profile-at: vLLM's profiler on every target at the load ``at`` names (running requests, a sweep's step, or
    the measured window), the windows kept (wall times) for the summary."""

    def __init__(self, hosts: tuple[str, ...], api_key: str, say: Callable[[str], None], at: ProfileAt) -> None:
        super().__init__(hosts, api_key, say)
        self.at = at
        self.started: float | None = None  # wall time the running profile started (None: not running)
        self.windows: list[dict] = []  # each profile: {"what", "start", "stop", "targets"}
        self._what = ""
        self._targets = 0

    def start(self, what: str) -> None:
        if self.started is not None:
            return
        hint = "vLLM serves it when started with --profiler-config): nothing is profiled there"
        self._targets = self._post(START, f"at {what}", hint)
        if self._targets:
            self.started, self._what = time.time(), what
            self.say(f"vllm-load: profiler started on {self._targets} target(s) at {what}")

    def stop(self) -> None:
        started, self.started = self.started, None  # before the POST (it yields): a second stop does nothing
        if started is None:
            return
        stopped_at = time.time()
        self._post(STOP, f"after {self._what}", "its profile was not stopped", timeout=STOP_TIMEOUT_S)
        self.windows.append({"what": self._what, "start": started, "stop": stopped_at, "targets": self._targets})
        self.say(f"vllm-load: profiler stopped after {stopped_at - started:.1f} s of {self._what} (the trace is "
                 "where the server's --profiler-config writes it)")


def check_profile_source(opts: Any, sidecar_url: str) -> None:
    """--profile-at N reads the server's running requests from its series: a sidecar (the embedded emulator's too)
    or a Prometheus; without one nothing would start the profiler (one line, exit 2)."""
    at = profile_point(opts)
    if at is not None and at.kind == "running" and not sidecar_url and not opts.prometheus_url:
        raise UsageError(f"--profile-at {opts.profile_at} starts on the server's running requests, read from its "
                         "series: give --sidecar-url (or --prometheus-url), or --profile-at run")
