"""The knee of a sweep's throughput curve: the level past which more load buys little more throughput (and only
latency). Kneedle (Satopää et al., 2011) on a concave increasing curve: both axes scaled to [0, 1], the knee is the
level where the curve stands furthest above the diagonal from its first point to its last. A curve with fewer than
three levels, or one that does not rise, has none (said, never guessed)."""

from __future__ import annotations


def knee(levels: list[float], values: list[float]) -> float | None:
    """The knee's level of ``values`` (e.g. output tokens/s) against ``levels`` (users or req/s), or None."""
    points = sorted((x, y) for x, y in zip(levels, values) if y is not None)
    if len(points) < 3:
        return None
    (x0, y0), (x1, y1) = points[0], points[-1]
    if x1 <= x0 or y1 <= y0:
        return None
    gaps = [((y - y0) / (y1 - y0)) - ((x - x0) / (x1 - x0)) for x, y in points]
    best = max(range(len(points)), key=lambda i: gaps[i])
    return points[best][0] if gaps[best] > 0 else None
