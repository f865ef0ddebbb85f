"""Child processes the locustfile starts itself: the vLLM emulator (no --host) and its sidecar."""

from __future__ import annotations

from typing import Any, Protocol

import atexit
import importlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gevent

from vllm_load import lifeline
from vllm_load.workload.graded import parse_accuracy
from vllm_load.errors import UsageError


def private_temp_file(what: str, suffix: str) -> Path:
    """A file of this process's own in the temp folder: mode 0600 (the emulator's log and the sidecar's series
    hold the run's timings), removed at exit (a 7-minute run left 2.2 MB behind per run)."""
    fd, name = tempfile.mkstemp(prefix=f"vllm-load-{what}-{os.getpid()}-", suffix=suffix)
    os.close(fd)
    path = Path(name)
    atexit.register(path.unlink, missing_ok=True)
    return path


@dataclass
class ChildServer:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)  # reaped: not left a zombie beside the run that started it


def server_package() -> str:
    """Where the emulator and sidecar live: ``vllm_load_server`` once installed (the repo's server/ folder
    under a name of its own), ``server`` in a checkout used without installing."""
    try:
        import vllm_load_server  # noqa: F401

        return "vllm_load_server"
    except ImportError:
        return "server"


def start_child(module: str, args: list[str], timeout: float = 60.0, log: Path | None = None) -> ChildServer:
    """Run ``python -m PACKAGE.MODULE ARGS`` (it binds 127.0.0.1) and wait for its "listening on URL" line."""
    package = importlib.import_module(server_package())
    root = str(Path(package.__file__).resolve().parent.parent)
    env = lifeline.child_env(dict(os.environ))  # it dies with this process, whatever kills it
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    module = f"{package.__name__}.{module}"
    err = open(log, "ab") if log is not None else None  # noqa: SIM115 (the child holds it)
    # a session of its own: a terminal's Ctrl-C goes to its whole foreground group, and the emulator died with it
    # while the run drained (2 requests failed mid-stream, exit 1); the run stops it after its drain
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=err, env=env,
                            start_new_session=True)
    if err is not None:
        err.close()
    emu = ChildServer(url="", process=proc)
    atexit.register(emu.stop)
    line = b""
    try:
        with gevent.Timeout(timeout):
            line = proc.stdout.readline() if proc.stdout else b""
    except gevent.Timeout:
        pass
    text = line.decode(errors="replace").strip()
    if "listening on " not in text:
        emu.stop()
        raise UsageError(f"{module} did not start ({text or 'no output'}): run python -m {module} to see why")
    emu.url = text.split("listening on ", 1)[1].split()[0]
    return emu


def start_emulator(extra_args: list[str], log: Path | None = None) -> ChildServer:
    """The embedded emulator; its own log lines (vLLM's periodic stats) go to ``log``, not to the console."""
    return start_child("emulator", ["--host", "127.0.0.1", "--port", "0", *extra_args], log=log)


def start_sidecar(vllm_url: str, out: Path) -> ChildServer:
    return start_child("sidecar", ["--vllm-url", vllm_url, "--listen", "127.0.0.1:0", "--interval", "1s",
                                          "--out", str(out)])


class Served(Protocol):
    """A server the run started for itself: where it listens, and how it stops."""

    url: str

    def stop(self) -> None: ...


class Children:
    """How a run with no --host starts its emulator and sidecar: as child processes (a run on the command line). An
    environment may carry another way in ``CHILDREN`` (``vllm_load.testing`` serves both inside the test's process,
    on its own event loop: no interpreter, tokenizer or port wait per run)."""

    def emulator(self, args: list[str], log: Path | None) -> Served:
        return start_emulator(args, log)

    def sidecar(self, vllm_url: str, out: Path) -> Served:
        return start_sidecar(vllm_url, out)


#: the Locust environment's attribute that names its ``Children`` (none: child processes)
CHILDREN = "vllm_load_children"


#: the embedded emulator's continuous batching when nothing else is asked: a GPU server scaled to this machine
DEFAULT_PROFILE, DEFAULT_SEQS = "small-gpu", 32
#: the options that ask for the fixed schedule (their defaults are the fixed schedule's own)
FIXED_OPTIONS = ("emulator_ttft", "emulator_itl", "emulator_tokens_per_chunk", "emulator_spec_tokens")


def emulator_profile(opts: Any) -> str | None:
    """The embedded emulator's batching profile, or None for the fixed schedule: --emulator-profile when given
    ('fixed': none), else the fixed schedule when one of its options was changed, else small-gpu."""
    from vllm_load.options import OPTIONS

    asked = str(getattr(opts, "emulator_profile", "") or "")
    if asked:
        return None if asked == "fixed" else asked
    by_dest = {o.dest: o for o in OPTIONS}
    if any(_given(opts, by_dest[k]) for k in FIXED_OPTIONS):
        return None
    return DEFAULT_PROFILE


def _given(opts: Any, option: Any) -> bool:
    """The option was asked for: a value other than its default, or given even at its default (on the command
    line or in its environment variable: --emulator-ttft 0.05 asks for the fixed schedule too)."""
    if getattr(opts, option.dest, option.default) != option.default:
        return True
    flag = option.flag
    return any(a == flag or a.startswith(flag + "=") for a in sys.argv[1:]) or bool(os.environ.get(option.env))


def emulator_mode(opts: Any) -> str:
    """How the embedded emulator serves, said with its start and kept in the run's config."""
    profile = emulator_profile(opts)
    if profile is None:
        return f"fixed schedule: TTFT {opts.emulator_ttft * 1000:g} ms, ITL {opts.emulator_itl * 1000:g} ms at any load"
    seqs = opts.emulator_max_num_seqs or (DEFAULT_SEQS if profile == DEFAULT_PROFILE else 256)
    policy = ", admitted by priority" if getattr(opts, "emulator_scheduling_policy", "fcfs") == "priority" else ""
    return f"continuous batching: profile {profile}, {seqs} sequences at a time{policy} (latency grows with load)"


def emulator_args(opts: Any, spans_endpoint: str | None = None) -> list[str]:
    """The embedded emulator's command line, from the run's --emulator-* options (and --otlp-receiver's endpoint,
    which it exports its request spans to, as vLLM would)."""
    args = ["--ttft", str(opts.emulator_ttft), "--itl", str(opts.emulator_itl),
            "--tokens-per-chunk", str(opts.emulator_tokens_per_chunk), "--enable-prompt-tokens-details",
            "--enable-per-request-metrics"]
    if opts.emulator_reasoning_tokens:
        args += ["--reasoning-tokens", opts.emulator_reasoning_tokens]
    graded = parse_accuracy(getattr(opts, "accuracy", None))  # --accuracy's sets, answered right at the rate given
    for s in graded:
        args += ["--graded", f"{s.kind}:{os.path.abspath(s.path)}"]
    if graded:
        args += ["--graded-correct", str(opts.emulator_graded_correct)]
    if opts.emulator_spec_tokens:
        args += ["--spec-tokens", str(opts.emulator_spec_tokens), "--spec-acceptance", str(opts.emulator_spec_acceptance)]
    if opts.emulator_dcgm:
        args += ["--dcgm"]
    profile = emulator_profile(opts)
    seqs = opts.emulator_max_num_seqs or (DEFAULT_SEQS if profile == DEFAULT_PROFILE else 0)
    if seqs:
        args += ["--max-num-seqs", str(seqs)]
    if getattr(opts, "emulator_scheduling_policy", "fcfs") != "fcfs":
        args += ["--scheduling-policy", opts.emulator_scheduling_policy]
    if spans_endpoint:
        args += ["--otlp-traces-endpoint", spans_endpoint]
    if getattr(opts, "load_lora", None):  # --load-lora's adapters: the embedded one loads them as vLLM would
        args += ["--allow-runtime-lora-updating"]
    return args + (["--profile", profile] if profile else [])
