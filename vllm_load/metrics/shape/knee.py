"""The knee of a sweep's throughput curve: the level past which more load buys little more throughput (and only
latency). Kneedle (Satopää et al., 2011) on a concave increasing curve: both axes scaled to [0, 1], the knee is the
level where the curve stands furthest above the diagonal from its first point to its last. The curve is its running
maximum (the most throughput any load up to that level bought): a server that collapses past its capacity (preemption,
a starved emulator) has a falling tail, and scaled to that tail's last point every level would look like a knee. A
curve with fewer than three levels, or one that does not rise, has none (said, never guessed)."""

from __future__ import annotations


def knee(levels: list[float], values: list[float]) -> float | None:
    """The knee's level of ``values`` (e.g. output tokens/s) against ``levels`` (users or req/s), or None."""
    points = sorted((x, y) for x, y in zip(levels, values) if y is not None)
    if len(points) < 3:
        return None
    for i in range(1, len(points)):  # the running maximum: a falling tail is the plateau it fell from
        points[i] = (points[i][0], max(points[i][1], points[i - 1][1]))
    (x0, y0), (x1, y1) = points[0], points[-1]
    if x1 <= x0 or y1 <= y0:
        return None
    gaps = [((y - y0) / (y1 - y0)) - ((x - x0) / (x1 - x0)) for x, y in points]
    best = max(range(len(points)), key=lambda i: gaps[i])
    return points[best][0] if gaps[best] > 0 else None
