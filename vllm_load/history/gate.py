"""The history feature's two hooks (``features/history.py`` names them): at a run's end, the baseline its relative
SLOs and headline lines are judged by (``at_end``, computed once, kept in the summary, so that ``vllm-load report``
judges the run again by the same baseline); once its files and exit code are final, the run recorded in the store
(``after_run``).

The store never decides a run's own numbers, and a store that cannot be reached costs the run nothing but its
record: a relative SLO then cannot be judged (exit code 3, said), and the run directory keeps everything
``vllm-load history import`` needs to record it later."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_load.feature_spec import RunEnd
from vllm_load.features.history import is_postgres
from vllm_load.history.baseline import headline, reference, select
from vllm_load.history.record import fingerprint, load_of, of_run_dir
from vllm_load.history.store import DEFAULT_FILE, Store, describe
from vllm_load.metrics.judge.slo import parse_slo_option
from vllm_load.rundir.files import RunDir


def _option(options: Any, name: str) -> Any:
    return options.get(name) if isinstance(options, Mapping) else getattr(options, name, None)


def store_url(options: Any, run_dir: str | Path) -> str:
    """``--results-db``, or the embedded store beside the run directory (``reports/history.sqlite``)."""
    return str(_option(options, "results_db") or "") or str(Path(run_dir).resolve().parent / DEFAULT_FILE)


def _reason(exc: BaseException) -> str:
    """A store's failure in one line (sqlite3's, psycopg's and the disk's messages run over several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def at_end(end: RunEnd) -> dict[str, Any] | None:
    """The run against its baseline: the references of its relative SLOs and the headline metrics' changes."""
    opts = end.options
    if not end.run_dir or _option(opts, "vllm_load_step_users") is not None:  # a sweep's step: its run's
        return None
    try:
        config = json.loads(RunDir(Path(end.run_dir)).config.read_text())
    except (OSError, ValueError):
        return None
    plan = config.get("plan") or {}
    slos = [s for s in parse_slo_option(list(plan.get("slos") or []), str(_option(opts, "window") or "run"))
            if s.relative is not None]
    text = str(_option(opts, "baseline") or "")
    url = store_url(opts, end.run_dir)
    if _option(opts, "no_history") and not text and not slos:
        return None
    if not is_postgres(url) and not Path(url).exists() and not text and not slos:
        return {"store": describe(url)}  # the first run of a store: nothing to compare with
    part: dict[str, Any] = {"store": describe(url)}
    fp = fingerprint(load_of(config))
    try:
        with Store.open(url) as store:
            base = select(store, text or "last", fp, end.start_wall, str(config.get("run_id") or ""))
    except Exception as exc:  # noqa: BLE001 - the store's failure (sqlite3's, psycopg's) is said, never the run's end
        why = f"the results store could not be read: {_reason(exc)}"
        part["baseline"] = {"spec": text, "asked": 0, "runs": [], "why": why, "said": ""}
        part["references"] = {s.text: {"baseline": None, "why": why} for s in slos}
        return part
    if not text and base.why and not slos:  # no baseline asked: only the headline, once there is history enough
        part["building"] = len(base.runs)
        return part
    part["baseline"] = base.to_json(text or "last")
    part["references"] = {s.text: reference(s, base) for s in slos}
    part["headline"] = headline(end.summary or {}, None, base)
    return part


def after_run(run_dir: str, exit_code: int, options: Any) -> list[str]:
    """Record the finished run in the store; a line says where (or why not, and how to record it later)."""
    if _option(options, "no_history") or _option(options, "vllm_load_step_users") is not None:
        return []
    url = store_url(options, run_dir)
    try:
        rec = of_run_dir(run_dir, exit_code=exit_code)
        with Store.open(url) as store:
            new = store.record(rec)
            same = store.count(rec.row["fingerprint"])
    except Exception as exc:  # noqa: BLE001 - a store's failure (sqlite3's, psycopg's, the disk's) costs its record only
        return [f"history: the run was not recorded in {describe(url)}: {_reason(exc)}; record it later: "
                f"vllm-load history import {run_dir} --results-db {describe(url)}"]
    said = "recorded" if new else "already recorded"
    return [f"history: run {rec.run_id} {said} in {describe(url)} ({same} run{'s' if same != 1 else ''} of this "
            f"load, fingerprint {rec.row['fingerprint']}): vllm-load history list --results-db {describe(url)}"]
