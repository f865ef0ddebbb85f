"""Per-step run directories of a sweep, and the sweep report built from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_load.workload.inputs.datasets import records_per_request
from vllm_load.metrics.histogram import PERCENTILES
from vllm_load.rundir.files import RunDir, load_series
from vllm_load.rundir.plan import RunPlan


def write_step_dirs(run_dir: Path, sweep: Any, end_wall: float) -> list[Path]:
    """One run directory per step (config, exact stats, the step's server window) under run_dir/steps/."""
    rd = RunDir(run_dir)
    config = json.loads(rd.config.read_text())
    series = load_series(rd.server)
    shown = RunPlan.from_wire(config["plan"]).shown_percentiles  # the run's --metric-percentiles
    computed = tuple(sorted({*PERCENTILES, *shown}))
    dirs = []
    mode = sweep.kind
    for step in sorted(sweep.steps):
        s = sweep.steps[step]
        level, start, end, stats = s.level, s.start, s.end or end_wall, s.stats
        sd = rd.step(step, mode, level)
        d = sd.path
        cfg: dict[str, Any] = {**config, "run_id": f"{config['run_id']}/step{step:02d}", "sweep_step": step}
        cfg["options"] = {**config.get("options", {}), "vllm_load_step_users": level, "sweep_level_kind": mode}
        sd.write(sd.config, cfg, indent=2)
        opts = config.get("options", {})
        summary = stats.summary(duration=max(end - start, 1e-9), records_per_request=records_per_request(
            opts.get("dataset") or "", opts.get("dataset_batch") or 0), percentiles=computed, shown=shown)
        sd.write(sd.stats, {"run_id": cfg["run_id"], "start": start, "end": end, "summary": summary,
                            "stats": stats.to_wire()})
        window = [s for s in series if start <= s["t"] <= end]
        if window:
            sd.write_series(sd.server, window)
        dirs.append(d)
    return dirs
