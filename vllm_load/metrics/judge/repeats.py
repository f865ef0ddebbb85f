"""The spread of a number over repeated runs of the same load: mean, standard deviation and a Student-t confidence
interval (scipy.stats: its t, Welch's test and the Wilson interval; imported where used, at a run's end), so that "B is 4.1 % faster" comes with how sure the runs make it (AIPerf's --num-profile-runs and vLLM's
Rust vllm-bench --num-runs report the same). A run directory's sweep steps at one level are its repeats
(``--sweep 16x5``)."""

from __future__ import annotations

import math
from typing import Iterable


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (scipy.stats)."""
    from scipy import stats

    return float(stats.t.ppf(p, df))


def spread(values: Iterable[float], confidence: float = 0.95) -> dict[str, float] | None:
    """Mean, sample standard deviation, coefficient of variation and the two-sided ``confidence`` interval of the
    mean over repeated runs; None with fewer than two values."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if n < 2:
        return None
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "cv": std / mean if mean else 0.0, "low": mean - half,
            "high": mean + half, "half": half, "confidence": confidence}


def spread_text(s: dict[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± half`` (the interval's half-width) in the caller's unit."""
    if s is None:
        return "-"
    return f"{s['mean'] * scale:.{digits}f} ± {s['half'] * scale:.{digits}f}"


def welch(a: list[float], b: list[float], confidence: float = 0.95) -> dict[str, float] | None:
    """B's mean against A's over repeated runs: the difference, as a share of A's mean, with its Welch confidence
    interval (unequal variances, Welch-Satterthwaite degrees of freedom); ``verdict`` is "higher", "lower" or
    "no difference" (the interval holds 0). None without two runs on each side."""
    sa, sb = spread(a, confidence), spread(b, confidence)
    if sa is None or sb is None or not sa["mean"]:
        return None
    diff = sb["mean"] - sa["mean"]
    if sa["std"] == 0 and sb["std"] == 0:
        half = 0.0
    else:  # Welch's interval of the difference (unequal variances, Welch-Satterthwaite degrees of freedom)
        from scipy import stats

        ci = stats.ttest_ind([float(x) for x in b if x is not None], [float(x) for x in a if x is not None],
                             equal_var=False).confidence_interval(confidence)
        half = (float(ci.high) - float(ci.low)) / 2.0
    verdict = "no difference" if abs(diff) <= half else "higher" if diff > 0 else "lower"
    return {"a": sa["mean"], "b": sb["mean"], "pct": diff / sa["mean"] * 100, "half_pct": half / abs(sa["mean"]) * 100,
            "verdict": verdict, "runs_a": sa["n"], "runs_b": sb["n"], "confidence": confidence}


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a share, ``correct`` of ``n`` (sound at 0 and n, unlike the normal one):
    --accuracy's right answers, --response-format's valid ones."""
    if n <= 0:
        return 0.0, 1.0
    from scipy import stats

    ci = stats.binomtest(int(correct), int(n)).proportion_ci(confidence_level=2 * stats.norm.cdf(z) - 1,
                                                             method="wilson")
    return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def interval_text(ci: list[float] | None) -> str:
    """A share's 95 % interval (``wilson``), in percent."""
    low, high = ci or (0.0, 1.0)
    return f"95% interval {low * 100:.1f}-{high * 100:.1f}%"
