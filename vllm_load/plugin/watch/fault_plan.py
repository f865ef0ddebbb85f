"""A fault plan: actions on the run's clock while the load goes on (``--fault 'AT: KIND: WHAT'``, repeatable, or
``--fault-plan FILE`` with one such line each), run once per swarm (by the master, or the local runner).

KIND is ``kill``, ``stop``, ``start``, ``restart`` or ``exec`` (WHAT: a command, run by ``sh -c`` in a session of
its own and waited for: ``kubectl rollout restart deployment/vllm``, ``kill -9 $(cat r2.pid)``), ``call`` (WHAT:
a Python hook of the locustfile's, ``@vllm_load.on_fault("name")``, called with the action), or ``drain`` /
``undrain`` (WHAT: one of ``--host a,b``'s replicas: no new request goes to it until it is undrained; its users
send to the next replica meanwhile, ``plugin/load/drain.py``). The kinds other than ``exec`` and ``call`` name what the
command does to the fleet, for the verdict and the charts. Each action's start and end (seconds from the run's
start) and outcome are kept; ``metrics/fleet/disruption.py`` judges what each did to the requests.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable

import gevent

from vllm_load.errors import UsageError
from vllm_load.plugin.swarm.worker_secrets import fault_env
from vllm_load.redact import redact_urls
from vllm_load.workload.inputs.input_files import read_text
from vllm_load.workload.lengths import parse_duration

KINDS = ("kill", "stop", "start", "restart", "exec", "call", "drain", "undrain")
#: the kinds that act on the run's own traffic (WHAT: a replica of --host), not by a command
ROUTING = ("drain", "undrain")
#: the longest a command may take before it is stopped (its action then ends failed)
COMMAND_TIMEOUT_S = 600.0
_LINE = re.compile(r"^\s*([^:]+?)\s*:\s*([a-z]+)\s*:\s*(.+?)\s*$")
#: the locustfile's hooks, by name (``on_fault``)
HOOKS: dict[str, Callable[[dict], Any]] = {}


def on_fault(name: str) -> Callable[[Callable[[dict], Any]], Callable[[dict], Any]]:
    """Register a locustfile's own fault action: ``--fault '30s: call: NAME'`` calls it with the action (a dict)."""
    def register(fn: Callable[[dict], Any]) -> Callable[[dict], Any]:
        HOOKS[name] = fn
        return fn
    return register


@dataclass(frozen=True)
class Action:
    at: float  # seconds from the run's start
    kind: str
    what: str
    after: bool = False  # 'AT after previous': not before the previous action ended

    @property
    def heading(self) -> str:
        """``undrain at 0 s after previous``: its kind and planned time, as its label and its end's line begin."""
        return f"{self.kind} at {self.at:g} s" + (" after previous" if self.after else "")

    @property
    def label(self) -> str:
        """How the verdict and the charts name it (a command's credentials redacted)."""
        return f"{self.heading}: {redact_urls(self.what)}"


#: an action's line at most (a 50 MB command was "OSError: Argument list too long", printed whole)
MAX_ACTION_BYTES = 64 * 1024


def parse_action(text: str, where: str = "--fault") -> Action:
    if len(text) > MAX_ACTION_BYTES:
        raise UsageError(f"{where} an action of {len(text) // 1024} KB: at most {MAX_ACTION_BYTES // 1024} KB a line "
                         "(put a long command in a script and run that)")
    m = _LINE.match(text)
    if not m:
        raise UsageError(f"{where} {text!r} is not an action: write 'AT: KIND: WHAT', e.g. '30s: kill: kill -9 "
                         f"$(cat r2.pid)' (KIND one of {', '.join(KINDS)})")
    at, kind, what = m.groups()
    if kind not in KINDS:
        raise UsageError(f"{where} {text!r}: {kind!r} is no action: use one of {', '.join(KINDS)}")
    after = re.fullmatch(r"(.+?)\s+after\s+previous", at)
    return Action(parse_duration(after.group(1) if after else at, f"{where} {text!r}: its time"), kind, what,
                  after is not None)


def parse_plan(faults: list[str] | None, plan_file: str = "") -> list[Action]:
    """Every action of ``--fault`` and ``--fault-plan``, by time; a bad one is a one-line UsageError."""
    actions = [parse_action(f) for f in faults or ()]
    if plan_file:
        lines = read_text(plan_file, "--fault-plan", "--fault-plan", MAX_ACTION_BYTES).splitlines()
        for n, line in enumerate(lines, 1):
            if line.strip() and not line.lstrip().startswith("#"):
                actions.append(parse_action(line, f"--fault-plan {plan_file} line {n}:"))
    return in_order(actions)


def in_order(actions: list[Action]) -> list[Action]:
    """The actions by time, each 'after previous' one kept right behind the action written before it (its
    previous): sorted by their own times, '0s after previous: undrain' went first and ran before the drain it
    followed, and the replica stayed drained for the rest of the run."""
    chains: list[list[Action]] = []
    for a in actions:
        if a.after and chains:
            chains[-1].append(a)
        else:
            chains.append([a])
    return [a for chain in sorted(chains, key=lambda c: c[0].at) for a in chain]


def check_hooks(actions: list[Action]) -> None:
    """A ``call`` names a hook the locustfile registered (checked once the locustfile is imported)."""
    for a in actions:
        if a.kind == "call" and a.what not in HOOKS:
            known = ", ".join(sorted(HOOKS)) or "none"
            raise UsageError(f"--fault '{a.label}': no @vllm_load.on_fault({a.what!r}) hook in the locustfile "
                             f"(registered: {known})")


def check_targets(actions: list[Action], hosts: tuple[str, ...]) -> list[Action]:
    """A ``drain``/``undrain`` names one of ``--host``'s replicas (its trailing / aside); the actions with it
    spelled as ``--host`` spells it."""
    out = []
    for a in actions:
        if a.kind in ROUTING:
            match = [h for h in hosts if h.rstrip("/") == a.what.rstrip("/")]
            if len(hosts) < 2 or not match:
                raise UsageError(f"--fault '{a.label}': {a.kind} takes one of --host's replicas (--host a,b), not "
                                 f"{redact_urls(a.what)!r}" + (f": give one of {', '.join(hosts)}" if len(hosts) > 1
                                                              else ""))
            a = Action(a.at, a.kind, match[0], a.after)
        out.append(a)
    return out


#: an action that starts this much after its planned time is flagged late in every output
LATE_S = 0.5


def run_plan(actions: list[Action], start_wall: float, done: list[dict], say: Callable[[str], None],
             route: Callable[[str, bool], None] = lambda _target, _drained: None,
             router: Callable[[], dict | str | None] = lambda: None) -> None:
    """Each action at its planned time from ``start_wall``, in a greenlet of its own (actions overlap: an undrain
    planned at 45 s ran at 76.4 s behind a restart, after the last request had started, and every output said 45 s);
    one written ``AT after previous`` starts at its time or when the previous action ends, whichever is later (its
    wait is as planned: ``waited_s``, and late only past that). Its
    record goes into ``done`` as it starts (its end and outcome when it ends), with its planned and actual start;
    killed (the run ended), every action still running is killed with its command's process group.
    ``route(target, drained)`` drains a replica (or brings it back) in every load process; ``router()`` reads the
    router's counters just before the action (``read_router``; None: no --router-metrics)."""
    running: list[gevent.Greenlet] = []
    previous: gevent.Greenlet | None = None
    try:
        for action in actions:
            previous = gevent.spawn(_run_action, action, start_wall, done, say, route, router,
                                    previous if action.after else None)
            running.append(previous)
        gevent.joinall(running)
    finally:
        gevent.killall([g for g in running if not g.dead], block=True, timeout=10)


def _run_action(action: Action, start_wall: float, done: list[dict], say: Callable[[str], None],
                route: Callable[[str, bool], None], router: Callable[[], dict | str | None],
                after: gevent.Greenlet | None) -> None:
    gevent.sleep(max(0.0, start_wall + action.at - time.time()))
    if after is not None:
        after.join()
    due = max(start_wall + action.at, time.time())  # an 'after previous' one is due when the previous ended
    counters = router()
    began = time.time()
    late, waited = began - due, due - (start_wall + action.at)
    record = {"at": action.at, "kind": action.kind, "label": action.label, "start": began,
              "started_s": round(began - start_wall, 3), "late_s": round(max(0.0, late), 3), "late": late > LATE_S,
              "after_previous": action.after, "waited_s": round(waited, 3), "end": None, "ended_s": None, "ok": None,
              "detail": ""}
    # every output names an action by its label: one that started later than planned says when and why
    if late > LATE_S:
        record["label"] = f"{action.label} (started at {began - start_wall:.1f} s, {late:.1f} s late)"
    elif waited > LATE_S:
        record["label"] = (f"{action.label} (started at {began - start_wall:.1f} s, when the previous action "
                           "ended, as planned)")
    if counters is not None:
        record["router_at"] = counters
    done.append(record)
    say(f"vllm-load: fault plan: {record['label']}")
    if action.kind in ROUTING:
        route(action.what, action.kind == "drain")
        ok, detail = True, ""
    else:
        ok, detail = _call(action) if action.kind == "call" else _command(action.what)
    ended = time.time()
    record.update(end=ended, ended_s=round(ended - start_wall, 3), ok=ok, detail=detail)
    say(f"vllm-load: fault plan: {action.heading} {'done' if ok else 'FAILED'} in "
        f"{ended - began:.1f} s (from {began - start_wall:.1f} to {ended - start_wall:.1f} s)"
        + (f": {detail}" if detail else ""))


def not_begun(actions: list[Action], done: list[dict], run_s: float) -> list[dict]:
    """The planned actions that never began, each with why: planned after the run's end, or the run stopped first
    (a fault planned after -t never ran and nothing said so)."""
    begun = [(d["at"], d["kind"]) for d in done]
    out = []
    for a in actions:
        if (a.at, a.kind) in begun:
            begun.remove((a.at, a.kind))
            continue
        why = "planned after the run's end" if a.at >= run_s else "the run ended before it began"
        out.append({"at": a.at, "kind": a.kind, "label": a.label, "start": None, "end": None, "ok": None,
                    "detail": f"never ran: {why} ({run_s:.1f} s)"})
    return out


def read_router(url: str) -> dict | str:
    """The router's counters now (``metrics/fleet/router_counters.parse``), or why they cannot be read (one line)."""
    import urllib.request

    from vllm_load.metrics.fleet.router_counters import parse

    try:
        with urllib.request.urlopen(url, timeout=5.0) as resp:
            return parse(resp.read().decode())
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return f"--router-metrics {redact_urls(url)} cannot be read ({getattr(exc, 'reason', None) or exc})"


#: the most of a command's output kept (its tail): ``exec: yes`` printing without end kept 1.4 GB in 5 s
OUTPUT_TAIL_BYTES = 64 * 1024


def _command(command: str) -> tuple[bool, str]:
    """``command`` run by ``sh -c`` in a session of its own (a terminal's Ctrl-C is the run's, not the command's),
    without the run's secrets in its environment, its output's tail kept; its whole process group is killed when it
    overruns or the run ends mid-command."""
    proc = subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=fault_env())
    kept = bytearray()
    try:
        with gevent.Timeout(COMMAND_TIMEOUT_S, False):
            while chunk := proc.stdout.read(65536) if proc.stdout is not None else b"":
                kept += chunk
                del kept[:-OUTPUT_TAIL_BYTES]
            proc.wait()
        if proc.poll() is None:
            return False, f"still running after {COMMAND_TIMEOUT_S:.0f} s: stopped"
    finally:
        if proc.poll() is None:  # overran, or the run ended mid-command (its greenlet killed): its group goes too
            _kill_group(proc)
        if proc.stdout is not None:
            proc.stdout.close()
    tail = redact_urls(kept.decode(errors="replace").strip()[-300:])
    return proc.returncode == 0, (f"exit {proc.returncode}" + (f": {tail}" if tail else "")) if proc.returncode else tail


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _call(action: Action) -> tuple[bool, str]:
    try:
        HOOKS[action.what]({"at": action.at, "kind": action.kind, "what": action.what})
    except Exception as exc:  # noqa: BLE001  (a user's hook: its failure is the action's, not the run's)
        return False, f"{type(exc).__name__}: {exc}"[:300]
    return True, ""
