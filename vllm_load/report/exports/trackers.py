"""A finished run logged to an experiment tracker: MLflow (``--mlflow-uri``) or Weights & Biases
(``--wandb-project``), each optional (``pip install 'vllm-load[mlflow]'`` / ``'vllm-load[wandb]'``).

What goes: the options this run set and what it ran against (params/config), the summary's numbers (metrics: rates,
counts, and every latency metric's mean and percentiles in ms), the verdict (tags: exit code, SLO verdict, trust,
target kind) and the run directory's files a reader opens (report.html, summary.json, vllm-result.json,
config.json). Everything comes from the run directory, after its report is written, so a tracker holds what the
directory holds; secrets are not in it (config.json's options are redacted when written)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vllm_load.client.apis.openai_api import public_url
from vllm_load.errors import UsageError
from vllm_load.metric_table import INPUT_TOKENS, OUTPUT_TOKENS
from vllm_load.metrics.summary import RunSummary

#: the run directory's files a tracker keeps (the request logs stay in the directory: they can be large)
ARTIFACTS = ("report.html", "summary.json", "vllm-result.json", "config.json")
#: seconds a tracker may take at the end of a run before it is given up (said): an unreachable --mlflow-uri kept
#: a 6 s run alive 258 s in MLflow's own retries
TRACKER_TIMEOUT_S = 8.0
#: MLflow keeps a param's value up to 6,000 characters; longer ones (a long --slo list) are cut with a mark
_PARAM_MAX = 500


def check_available(opts: Any) -> None:
    """Before the run: a tracker option without its package is one line and exit 2, not a loss at the end."""
    for flag, dest, module, extra in (("--mlflow-uri", "mlflow_uri", "mlflow", "mlflow"),
                                      ("--wandb-project", "wandb_project", "wandb", "wandb")):
        if getattr(opts, dest, ""):
            try:
                __import__(module)
            except ImportError:
                raise UsageError(f"{flag} needs the {module} package: pip install 'vllm-load[{extra}]'") from None


def params(config: dict, is_emulator: bool) -> dict[str, str]:
    """What the run was: its target, model and every option it set (the rest are at their defaults)."""
    from vllm_load.report.html import _options_split

    changed, _ = _options_split(config.get("options", {}))
    out = {"target": "emulator" if is_emulator else str(config.get("host")),  # config.json's: no credentials
           "model": str(config.get("model")), "run_id": str(config.get("run_id"))}
    for key, value in changed:
        text = str(value)
        out[key] = text if len(text) <= _PARAM_MAX else text[:_PARAM_MAX - 1] + "…"
    return out


def metrics(summary: dict) -> dict[str, float]:
    """The summary's numbers: rates and counts as they are, latencies (seconds in the summary) in ms."""
    out: dict[str, float] = {}
    for key in ("requests", "succeeded", "failed", "duration_s", "request_rate", "output_token_rate",
                INPUT_TOKENS, OUTPUT_TOKENS, "goodput", "good_request_fraction"):
        if isinstance(summary.get(key), (int, float)):
            out[key] = float(summary[key])
    summary = RunSummary.of(summary)
    for name, stats in (summary.metrics or {}).items():
        if not stats.count:
            continue
        for stat, value in stats.items():
            if stat != "count" and isinstance(value, (int, float)):
                out[f"{name}_{stat}_ms"] = float(value) * 1000.0
    e = summary.energy
    if e:
        for key, value in (("energy_j", e.energy_j), ("average_power_w", e.average_power_w),
                           ("energy_per_output_token_j", e.energy_per_output_token_j),
                           ("output_tokens_per_joule", e.output_tokens_per_joule)):
            if isinstance(value, (int, float)):
                out[key] = float(value)
    return out


def tags(data: dict, is_emulator: bool) -> dict[str, str]:
    """The verdict, as ``summary.json`` has it."""
    trust = data.get("trust") or {}
    return {"vllm_load.exit_code": str(data.get("exit_code")), "vllm_load.verdict": str(data.get("verdict") or "none"),
            "vllm_load.trustworthy": str(bool(trust.get("passed", True))).lower(),
            "vllm_load.target_kind": "emulator" if is_emulator else "server"}


def _files(run_dir: Path) -> list[Path]:
    return [run_dir / name for name in ARTIFACTS if (run_dir / name).exists()]


def log_mlflow(uri: str, experiment: str, run_dir: Path) -> str:
    """The run as an MLflow run of ``experiment``; returns its id."""
    import mlflow

    from vllm_load.rundir.files import RunDir, load_run

    run = load_run(run_dir)
    data = json.loads(RunDir(run_dir).summary_json.read_text())
    client = mlflow.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    tracked = client.create_run(experiment_id, run_name=str(run.config.get("run_id")),
                                tags=tags(data, run.is_emulator))
    rid = tracked.info.run_id
    try:
        from mlflow.entities import Metric, Param

        now = int(run.end * 1000)
        client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in metrics(data["summary"]).items()],
                         params=[Param(k, v) for k, v in params(run.config, run.is_emulator).items()])
        for path in _files(run_dir):
            client.log_artifact(rid, str(path))
    except Exception:
        client.set_terminated(rid, status="FAILED")
        raise
    client.set_terminated(rid, status="FINISHED")
    return rid


def log_wandb(project: str, run_dir: Path) -> str:
    """The run as a W&B run of ``project`` (offline with WANDB_MODE=offline); returns its id."""
    import wandb

    from vllm_load.rundir.files import RunDir, load_run

    run = load_run(run_dir)
    data = json.loads(RunDir(run_dir).summary_json.read_text())
    os.environ.setdefault("WANDB_SILENT", "true")
    tracked = wandb.init(project=project, name=str(run.config.get("run_id")), dir=str(run_dir),
                         config=params(run.config, run.is_emulator), tags=[f"{k}={v}" for k, v in
                                                                           tags(data, run.is_emulator).items()],
                         reinit="create_new",
                         # W&B records the command line (a --*-token on it) and the host's details by default: not here
                         settings=wandb.Settings(x_disable_meta=True, x_disable_machine_info=True, disable_git=True,
                                                 disable_code=True, save_code=False, x_disable_stats=True,
                                                 x_save_requirements=False))
    try:
        tracked.summary.update(metrics(data["summary"]))
        for path in _files(run_dir):
            tracked.save(str(path), base_path=str(run_dir), policy="now")
    finally:
        tracked.finish()
        # its service shut down now: left to the interpreter's exit, W&B's atexit hook met a closed event loop and
        # printed a traceback ("Event loop is closed") after a run that had logged fine
        wandb.teardown()
    return tracked.id


def log_run(opts: Any, run_dir: Path, timeout: float = TRACKER_TIMEOUT_S) -> list[str]:
    """Every tracker the options name; one line per tracker of what happened (a failure or a tracker that took
    longer than ``timeout`` seconds is said, never fatal)."""
    import gevent

    # MLflow retries an unreachable server for minutes by default: one try, bounded, and the bound above it
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(timeout)))
    lines = []
    jobs = []
    if getattr(opts, "mlflow_uri", ""):
        experiment = opts.mlflow_experiment or "vllm-load"
        jobs.append(("MLflow", lambda: log_mlflow(opts.mlflow_uri, experiment, run_dir),
                     f"MLflow at {public_url(opts.mlflow_uri)} (experiment {experiment}"))
    if getattr(opts, "wandb_project", ""):
        jobs.append(("W&B", lambda: log_wandb(opts.wandb_project, run_dir), f"W&B (project {opts.wandb_project}"))
    for name, job, where in jobs:
        try:
            with gevent.Timeout(timeout, TimeoutError(f"no answer within {timeout:g} s")):
                rid = job()
            lines.append(f"vllm-load: run logged to {where}, run {rid})")
        except BaseException as exc:  # noqa: BLE001 - a tracker's fault must not cost the run its exit code
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            lines.append(public_url(f"vllm-load: the run was not logged to {name}: {type(exc).__name__}: {exc}"
                                    .splitlines()[0]))
    return lines
