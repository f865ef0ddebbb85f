"""The spread of a number over repeated runs of the same load: mean, standard deviation and a Student-t confidence
interval, so that "B is 4.1 % faster" comes with how sure the runs make it (AIPerf's --num-profile-runs and vLLM's
Rust vllm-bench --num-runs report the same). A run directory's sweep steps at one level are its repeats
(``--sweep 16x5``)."""

from __future__ import annotations

import math
from typing import Iterable


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom, by bisection on its CDF."""
    def cdf(t: float) -> float:
        tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
        return 1.0 - tail if t >= 0 else tail

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2.0


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
    va, vb = sa["std"] ** 2 / sa["n"], sb["std"] ** 2 / sb["n"]
    diff = sb["mean"] - sa["mean"]
    if va + vb == 0:
        half = 0.0
    else:
        df = (va + vb) ** 2 / ((va ** 2 / (sa["n"] - 1) if va else 0.0) + (vb ** 2 / (sb["n"] - 1) if vb else 0.0))
        half = t_quantile(0.5 + confidence / 2.0, max(1, round(df))) * math.sqrt(va + vb)
    verdict = "no difference" if abs(diff) <= half else "higher" if diff > 0 else "lower"
    return {"a": sa["mean"], "b": sb["mean"], "pct": diff / sa["mean"] * 100, "half_pct": half / abs(sa["mean"]) * 100,
            "verdict": verdict, "runs_a": sa["n"], "runs_b": sb["n"], "confidence": confidence}


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a share, ``correct`` of ``n`` (sound at 0 and n, unlike the normal one):
    --accuracy's right answers, --response-format's valid ones."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def interval_text(ci: list[float] | None) -> str:
    """A share's 95 % interval (``wilson``), in percent."""
    low, high = ci or (0.0, 1.0)
    return f"95% interval {low * 100:.1f}-{high * 100:.1f}%"
