"""The headline charts as picture files (PNG and SVG) beside the report, for what cannot open report.html: a CI
job summary, a pull-request comment, a slide, a paper (a run directory held no figure). Drawn with matplotlib's
Agg backend, imported only when figures are written, from the same chart specs the pages draw with uPlot
(``report/charts.py``): one definition of each chart. Each series is an SVG group of its own (``series-N``), so a
test (or a reader) can count what was drawn."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

#: the files each chart is written as
FORMATS = ("png", "svg")
#: a figure's size: 8 x 3.2 inches at 100 dpi (800 x 320 pixels), as wide as a CI job summary shows
SIZE, DPI = (8.0, 3.2), 100
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def _values(values: list[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def draw(spec: dict[str, Any], folder: Path) -> list[Path]:
    """One chart spec (``charts.chart``'s form) written as ``folder/ID.png`` and ``.svg``; the paths written."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    right = ax.twinx() if spec.get("y2_label") else None
    for i, s in enumerate(spec["series"]):
        on = right if right is not None and s.get("axis") == "y2" else ax
        (line,) = on.plot(spec["x"], _values(s["values"]), label=s["label"], color=COLORS[i % len(COLORS)],
                          linestyle="--" if s.get("dash") else "-", drawstyle="steps-post" if s.get("step") else
                          "default", marker="o" if spec.get("kind") == "level" or len(spec["x"]) < 3 else None,
                          markersize=3 if spec.get("kind") == "level" else 5, linewidth=1.5)  # a lone point is a dot
        line.set_gid(f"series-{i}")
    ax.set_title(spec["title"], fontsize=10, loc="left")
    ax.set_xlabel("t (s)" if spec.get("kind") == "time" else spec["x_label"], fontsize=9)
    ax.set_ylabel(spec["y_label"], fontsize=9)
    if spec.get("kind") == "nines":  # the x axis counts nines (0 .. 3): ticks named as the page names them
        ax.set_xticks([0.0, math.log10(2), 1.0, 2.0, 3.0], ["p0", "p50", "p90", "p99", "p99.9"])
    if spec.get("y_range"):
        ax.set_ylim(*spec["y_range"])
    else:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        right.set_ylabel(spec["y2_label"], fontsize=9)
        right.set_ylim(bottom=0)
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, fontsize=8, loc="best")
    folder.mkdir(parents=True, exist_ok=True)
    out = [folder / f"{spec['id']}.{fmt}" for fmt in FORMATS]
    with rc_context({"svg.fonttype": "none"}):  # the SVG's words as text (searchable, smaller), not outlines
        for path in out:
            fig.savefig(path, format=path.suffix[1:])
    return out


def off_by_environment() -> bool:
    """``VLLM_LOAD_NO_FIGURES`` (--no-figures' variable) set: read by the commands that are no Locust run (compare,
    tune), which have no parser of their own to read it."""
    return os.environ.get("VLLM_LOAD_NO_FIGURES", "").strip().lower() in ("1", "true", "yes", "on")


def write_figures(specs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Every spec with points drawn into ``folder``; the PNG and SVG paths, in the specs' order."""
    return [p for spec in specs if spec.get("x") for p in draw(spec, folder)]


def markdown(paths: list[Path], base: Path) -> str:
    """The figures as summary.md shows them: each PNG as an image, its SVG beside it (paths relative to ``base``);
    '' without any."""
    pngs = [p for p in paths if p.suffix == ".png"]
    if not pngs:
        return ""
    lines = ["## Figures", ""]
    for png in pngs:
        rel = png.relative_to(base).as_posix()
        lines += [f"![{png.stem}]({rel})", f"([SVG]({rel[:-4]}.svg))", ""]
    return "\n".join(lines)
