"""vllm-load runs inside one process, for tests (this project's, or a user's of their own locustfiles).

``run(["-f", "locustfiles/chat.py", "--headless", "-u", "4", "-t", "3s"])`` builds what ``locust`` builds from the same
arguments: Locust's own parser (the plugin's options and the locustfile's included), an ``Environment`` with events
of its own, its runner (a local runner, or with ``--processes N`` a master and N workers joined over Locust's ZMQ on
127.0.0.1, as Locust's own ``test_runners.py`` runs them), the plugin's role object on each (``LocalProcess``,
``MasterProcess``, ``WorkerProcess``, made by the same init hook), Locust's headless start and stop, and its
shutdown: the quitting event, the exit code decision, the quit event. With no --host the embedded emulator and its
sidecar are served on this process's event loop (``InProcessChildren``) instead of as child processes. What the run
printed is captured; the ``Outcome`` holds it, the exit code, the run directory and the role objects themselves.

What differs from a ``locust`` process, by design: no interpreter per run, the emulator shares this process's event
loop (a timing test that needs the emulator's own core starts it as a process and gives --host), no signal of its
own, Locust's CSV writer and HTML report are not written. What only a process shows (signals, forks, the console's
order against Locust's own tables, exit codes of the real command) stays in the end-to-end tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from locust import log as locust_log

from vllm_load.plugin.lifecycle import listeners, log_repeats
from vllm_load.plugin.lifecycle.process import Process
from vllm_load.testing.context import captured, environ, greenlets
from vllm_load.testing.swarm import InProcessChildren, Loaded, Swarm, locustfile_of

__all__ = ["InProcessChildren", "Outcome", "Running", "Swarm", "run", "start"]


@dataclass
class Outcome:
    """What a run left: its exit code, what it printed (stdout, and stderr with the log lines), its run directory,
    and the role objects (``process``: the local runner's or the master's; ``workers``: each worker's)."""

    code: int
    stdout: str
    stderr: str
    run_dir: Path | None = None
    process: Process | None = None
    workers: list[Process] = field(default_factory=list)

    @property
    def returncode(self) -> int:  # the name subprocess gives it: a test can take either
        return self.code

    @property
    def run(self) -> Any:
        """The last run (``plugin.run.Run``): its plan, collector (merged totals, results) and generator."""
        return self.process.run if self.process is not None else None

    def summary(self) -> dict:
        """``summary.json`` as the run wrote it (the summary, the verdict, the SLO checks)."""
        import json

        assert self.run_dir is not None, "the run wrote no run directory"
        return json.loads((self.run_dir / "summary.json").read_text())

    def requests(self) -> list[dict]:
        """Every request line of the run's request logs (a swarm's workers each write their own)."""
        from vllm_load.rundir.reqlog import read_log

        assert self.run_dir is not None, "the run wrote no run directory"
        return [r for f in sorted(self.run_dir.glob("requests*.jsonl")) for r in read_log(f)]



class Running:
    """A headless run going on in this process (``start``), in a greenlet of its own: the test does its part beside
    it (kills a server, reads a page) and then waits for the run's own end (``wait``) or ends it (``stop``)."""

    def __init__(self, args: list[str], cwd: Path | str | None, env: dict[str, str | None] | None, timeout: float,
                 worker_args: list[str] | None, emulator_process: bool) -> None:
        self.args = list(args)
        self.workers = 0
        if "--processes" in self.args:
            i = self.args.index("--processes")
            self.workers = int(self.args[i + 1])
            del self.args[i:i + 2]
        self.cwd, self.env, self.timeout = Path(cwd) if cwd is not None else None, env, timeout
        self.worker_args, self.emulator_process = worker_args, emulator_process
        self.swarm: Swarm | None = None
        self.started = gevent.event.Event()  # the users are starting (the runner exists)
        self.greenlet = gevent.spawn(self._run)

    def _run(self) -> Outcome:
        log_repeats.install().counts.clear()  # "logged once" counts per run, not per test process
        locust_log.unhandled_greenlet_exception = False
        before = greenlets() | {gevent.getcurrent()}
        code = 0
        with captured() as (out, err), environ(self.env, self.args, self.cwd):
            try:
                loaded = Loaded.load(locustfile_of(self.args))
                self.swarm = Swarm(loaded, self.args, self.workers, self.worker_args,
                                   in_process_children=not self.emulator_process)
                self.swarm.init()
                opts = self.swarm.opts
                if opts.headless or opts.autostart:
                    self.swarm.start()
                self.started.set()
                if opts.headless:
                    self.swarm.wait(self.timeout)
                else:  # the web UI's process lives until it is stopped (Locust's main greenlet is the UI's)
                    self.swarm.web_ui.greenlet.join()
                code = self.swarm.shutdown()
            except SystemExit as exc:  # one line and exit 2 (bad input), as the command line leaves
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                self.started.set()
                if self.swarm is not None:
                    self.swarm.close()
                # nothing of the run outlives it (a locustfile's own greenlet, a server's loop): a later run or test
                # in this process would share the loop with it (one that held the loop 50 ms in 70 slowed a test 20x)
                gevent.killall(list(greenlets() - before), block=True, timeout=5)
        return self._outcome(code, out.getvalue(), err.getvalue())

    def _outcome(self, code: int, out: str, err: str) -> Outcome:
        swarm = self.swarm
        if swarm is None:
            return Outcome(code, out, err)
        ready = [e.__dict__.get(listeners.READY) for e in (swarm.env, *swarm.workers)]
        processes = [r.value for r in ready if r is not None and r.ready()]  # closed at the end: still the objects
        process = processes[0] if ready[0] is not None and ready[0].ready() else None
        run_dir = process.run.plan.files.path if process is not None and process.run is not None else None
        return Outcome(code, out, err, run_dir, process, processes[1:] if process is not None else processes)

    def wait(self, timeout: float | None = None) -> Outcome:
        """Until the run ends by itself (-t, --num-requests, a stop of its own)."""
        return self.greenlet.get(timeout=timeout if timeout is not None else self.timeout + 60)

    @property
    def web_url(self) -> str:
        """The web UI's address (a run without --headless), once it listens."""
        self.started.wait()
        ui = self.swarm.web_ui if self.swarm is not None else None
        deadline = time.monotonic() + 30
        while ui is not None and getattr(ui, "server", None) is None and time.monotonic() < deadline:
            gevent.sleep(0.01)
        if ui is None or getattr(ui, "server", None) is None:
            raise RuntimeError("the run serves no web UI (--headless, or it failed at start-up)")
        return f"http://127.0.0.1:{ui.server.server_port}"

    def stop(self) -> Outcome:
        """End the run now, as its -t would (the drain, the end, the exit code; a web UI stops too), and wait for
        its end."""
        self.started.wait()
        if self.swarm is not None and self.swarm.env.runner is not None:
            self.swarm.env.runner.quit()
            if self.swarm.web_ui is not None and getattr(self.swarm.web_ui, "server", None) is not None:
                self.swarm.web_ui.stop()
        return self.wait()


def start(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str | None] | None = None,
          timeout: float = 120.0, worker_args: list[str] | None = None, emulator_process: bool = False) -> Running:
    """``run``, in a greenlet beside the caller: ``wait()`` or ``stop()`` gives its Outcome."""
    return Running(args, cwd, env, timeout, worker_args, emulator_process)


def run(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str | None] | None = None,
        timeout: float = 120.0, worker_args: list[str] | None = None, emulator_process: bool = False) -> Outcome:
    """A headless run of ``args`` (``locust``'s own arguments; ``--processes N``: a master and N workers here) in
    this process, as ``locust ARGS`` would run it in ``cwd`` with ``env`` added to its environment.
    ``emulator_process``: with no --host, the embedded emulator and sidecar are child processes, as on the command
    line (a test of timing against the emulator's own schedule: served here, it shares the client's event loop)."""
    return start(args, cwd=cwd, env=env, timeout=timeout, worker_args=worker_args,
                 emulator_process=emulator_process).wait()
