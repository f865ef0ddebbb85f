"""The run directory: the one place that knows its file names and writes them (``RunDir``: each file whole or
not at all), and reads a run back (config, exact stats and summary, the sidecar's series) for reports and
comparisons. Renderers return text; only a ``RunDir`` writes it (the per-request logs: ``reqlog.py``)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.redact import redact_urls
from vllm_load.metrics.stats import LLMStats
from vllm_load.metrics.summary import RunSummary, json_default
from vllm_load.metrics.judge.verdict import Verdict

#: written into config.json; a reader of a newer format says so instead of misreading it
FORMAT_VERSION = 1


@dataclass(frozen=True)
class RunDir:
    """The files of one run directory (or of one sweep step's, under ``steps/``)."""

    path: Path

    config = property(lambda self: self.path / "config.json")  # target, plan, options (no secrets)
    stats = property(lambda self: self.path / "llm_stats.json")  # exact summary and raw histograms
    server = property(lambda self: self.path / "server.jsonl")  # the sidecar's samples, on our clock
    dcgm = property(lambda self: self.path / "dcgm.jsonl")  # GPU telemetry (--dcgm-url), on our clock
    spans = property(lambda self: self.path / "spans.jsonl")  # the server's request spans (--otlp-receiver)
    timing = property(lambda self: self.path / "timing.jsonl")  # those spans joined to the requests, one line each
    summary_json = property(lambda self: self.path / "summary.json")
    summary_md = property(lambda self: self.path / "summary.md")
    junit = property(lambda self: self.path / "junit.xml")
    report = property(lambda self: self.path / "report.html")
    steps = property(lambda self: self.path / "steps")
    sweep_html = property(lambda self: self.path / "sweep.html")
    sweep_md = property(lambda self: self.path / "sweep.md")
    vllm_result = property(lambda self: self.path / "vllm-result.json")  # as vllm bench serve --save-result
    llmd_report = property(lambda self: self.path / "benchmark_report_v0.2.yaml")  # llm-d's Benchmark Report
    mlperf_result = property(lambda self: self.path / "performance" / "result_summary.json")  # MLPerf Endpoints'
    llm_csv = property(lambda self: self.path / "llm_stats.csv")  # one row per metric and name
    figures = property(lambda self: self.path / "figures")  # the headline charts as PNG and SVG files

    def requests(self, worker: str | None) -> Path:
        """The per-request log: one file for a local run, one per worker in a swarm (``worker``: "w3-hostname")."""
        if worker is None:
            return self.path / "requests.jsonl"
        return self.path / ("requests-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in worker) + ".jsonl")

    def step(self, step: int, mode: str, level: float) -> RunDir:
        return RunDir(self.steps / f"{step:02d}-{mode}-{level:g}")

    def write(self, file: Path, content: Any, indent: int | None = None) -> Path:
        """One of this directory's files (``self.report``, ``self.summary_json``, …), written whole or not at all
        (a report rebuilt mid-run never reads half a file): text as it is, anything else as JSON."""
        if file.parent != self.path:
            raise ValueError(f"{file} is not a file of the run directory {self.path}")
        self.path.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else json.dumps(content, indent=indent, default=json_default)
        _replace(file.with_name(file.name + ".tmp"), redact_urls(text), file)
        return file

    def write_series(self, file: Path, samples: list[dict]) -> Path:
        """A series of samples (``self.server``, ``self.dcgm``) as JSON lines."""
        return self.write(file, "".join(json.dumps(s) + "\n" for s in samples))

    def copy_in(self, source: Path, name: str) -> Path:
        """A file made elsewhere (the embedded emulator's log) kept beside the run's numbers."""
        target = self.path / name
        shutil.copyfile(source, target)
        return target


def holds_a_run(path: Path) -> bool:
    """``path`` already holds a run's files: a run into it would mix with them (two headless runs into one
    --run-dir left 20 lines in requests.jsonl beside a summary of 10)."""
    rd = RunDir(path)
    return path.is_dir() and (any(f.exists() for f in (rd.config, rd.summary_json, rd.stats))
                              or any(path.glob("requests*.jsonl")))


def own_run_dir(asked: str, run_id: str) -> str:
    """The directory a run writes to: ``asked`` (--run-dir), or beside it under the run id when it holds an
    earlier run (the web UI's second run, a re-run of a command, every run of a Kubernetes master)."""
    return f"{asked.rstrip('/')}-{run_id}" if holds_a_run(Path(asked)) else asked


def check_writable(path: Path, option: str = "--run-dir") -> int:
    """Before the run: ``path`` is, or can be made, a directory this process can write; returns its free bytes.
    A run that cannot keep its files is refused with one line instead of losing them at the end."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a directory: name a directory")
    made = [p for p in (path, *path.parents) if not p.exists()]  # removed again: a refused run leaves nothing
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".vllm-load-probe-"):
            pass
        return shutil.disk_usage(path).free
    except OSError as exc:
        raise UsageError(f"{option} {path} cannot be written ({exc.strerror or exc}): name a directory you can "
                         "write") from None
    finally:
        for p in made:  # deepest first
            try:
                p.rmdir()
            except OSError:
                break


def free_text(free: int) -> str:
    """Free bytes as the console says them."""
    return f"{free / 1e9:.1f} GB free" if free >= 1e9 else f"{free / 1e6:.0f} MB free"


def _replace(tmp: Path, text: str, path: Path) -> None:
    """``text`` into ``tmp``, then renamed over ``path``; a failed write leaves neither half a file nor ``tmp``."""
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class Run:
    path: Path
    config: dict
    start: float
    end: float
    stats: LLMStats
    summary: RunSummary
    server: list[dict]

    @property
    def is_emulator(self) -> bool:
        return bool(self.config.get("target_is_emulator"))

    @property
    def plan(self) -> Any:
        """The run's ``RunPlan`` as config.json kept it (users, processes, targets, SLOs …); None for a run
        directory without one."""
        from vllm_load.rundir.plan import RunPlan  # it names RunDir: imported when read

        return RunPlan.from_wire(self.config["plan"]) if self.config.get("plan") else None

    @property
    def target_kind(self) -> str:
        """EMULATOR, vLLM 0.32.0, …: decided at the run's start (a run from before it was kept: from the flag)."""
        return self.config.get("target_kind") or ("EMULATOR" if self.is_emulator else "")

    @property
    def verdict(self) -> Verdict | None:
        """The verdict its ``summary.json`` keeps (None before the run's end wrote it)."""
        try:
            return Verdict.from_json(json.loads(RunDir(self.path).summary_json.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    @property
    def slo_texts(self) -> list[str]:
        """The run's SLOs as parsed on its master (the plan), or, in older run dirs, its --slo options."""
        plan = self.config.get("plan") or {}
        return list(plan.get("slos") or self.config.get("options", {}).get("slo") or [])

    @property
    def concurrency(self) -> Any:
        """The run's level: its sweep step's users (or rate), else its user count."""
        o = self.config.get("options", {})
        value = o.get("vllm_load_step_users") or o.get("num_users") or o.get("users")
        return int(value) if isinstance(value, float) and value.is_integer() else value


def load_run(path: str | Path) -> Run:
    p = Path(path)
    try:
        config = json.loads(RunDir(p).config.read_text())
        data = json.loads(RunDir(p).stats.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{p} is not a complete run directory ({exc.__class__.__name__}): "
                         "it needs config.json and llm_stats.json") from None
    if int(config.get("format", 1)) > FORMAT_VERSION:
        raise UsageError(f"{p} was written by a newer vllm-load (run-dir format {config['format']}): upgrade to read it")
    server = load_series(RunDir(p).server)
    return Run(p, config, data["start"], data["end"], LLMStats.from_wire(data["stats"]),
               RunSummary.from_json(data["summary"]), server)


def load_series(path: Path) -> list[dict]:
    """The samples of a run directory's server.jsonl (none when it is missing); torn lines are skipped."""
    out: list[dict] = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
