"""Energy from GPU telemetry (NVIDIA's DCGM exporter): what the run's tokens cost in joules.

A sample is ``{"t": wall time on our clock, "gpus": {gpu: {"power_w", "energy_mj", "util", "fb_mib", "sm_mhz"}}}``.
Over the run's window each GPU's energy is the rise of its energy counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
read at the window's edges between the samples around them), or, without the counter, the power's trapezoid
integral; the GPUs add up."""

from __future__ import annotations

import bisect

from vllm_load.metrics.summary_parts import Energy


def interpolate_at(points: list[tuple[float, float]], x: float) -> float:
    """A sampled curve's value at ``x``: linear between the samples around it, flat beyond the first and last."""
    xs = [t for t, _ in points]
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _integral(points: list[tuple[float, float]], start: float, end: float) -> float:
    """The trapezoid integral of a sampled curve over [start, end] (held flat beyond its first and last samples)."""
    if not points:
        return 0.0
    xs = [start] + [t for t, _ in points if start < t < end] + [end]
    ys = [interpolate_at(points, x) for x in xs]
    return sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))


def energy_summary(samples: list[dict], start: float, end: float, output_tokens: int, requests: int) -> Energy | None:
    """The energy block of a summary, or None without telemetry in the window."""
    if not samples or end <= start:
        return None
    gpus = sorted({g for s in samples for g in s.get("gpus", {})})
    if not gpus:
        return None
    joules, by_counter = 0.0, True
    powers: list[float] = []
    utils: list[float] = []
    for g in gpus:
        rows = [(s["t"], s["gpus"][g]) for s in samples if g in s.get("gpus", {})]
        counter = [(t, r["energy_mj"] / 1000.0) for t, r in rows if r.get("energy_mj") is not None]
        power = [(t, r["power_w"]) for t, r in rows if r.get("power_w") is not None]
        if len(counter) >= 2:
            joules += interpolate_at(counter, end) - interpolate_at(counter, start)
        else:
            by_counter = False
            joules += _integral(power, start, end)
        powers += [p for t, p in power if start <= t <= end]
        utils += [r["util"] for t, r in rows if start <= t <= end and r.get("util") is not None]
    seconds = end - start
    return Energy({
        "gpus": len(gpus),
        "source": "energy counter" if by_counter else "power samples",
        "energy_j": joules,
        "average_power_w": joules / seconds,
        "power_max_w": max(powers) if powers else None,
        "gpu_util_mean": sum(utils) / len(utils) if utils else None,
        "energy_per_output_token_j": joules / output_tokens if output_tokens else None,
        "energy_per_request_j": joules / requests if requests else None,
        "output_tokens_per_joule": output_tokens / joules if joules > 0 else None,
    })
