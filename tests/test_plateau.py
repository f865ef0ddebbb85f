"""The TPOT plateau (metrics/shape/plateau.py): a step's steady-state window by the decode speed its requests saw, the
basis of an MLPerf Endpoints point."""

from __future__ import annotations

import random

from vllm_load.metrics.shape.plateau import BINS, plateau_start, steady_point


def records(tpots: list[float], tokens: int = 10) -> list[dict]:
    """One request per 0.1 s, each 1 s long, with these TPOTs (in order of their ends)."""
    return [{"start": i * 0.1, "e2e": 1.0, "tpot": t, "ttft": 0.05 + i * 1e-4, "output_tokens": tokens, "ok": True}
            for i, t in enumerate(tpots)]


def test_a_ramping_tpot_opens_the_window_once_it_settled():
    rng = random.Random(7)
    # the first half ramps from 5 ms to 20 ms (a batch growing), the second holds 20 ms +- 0.5
    ramp = [0.005 + 0.015 * i / 100 for i in range(100)] + [0.020 + rng.uniform(-5e-4, 5e-4) for _ in range(100)]
    # bins of 25: [50, 75) still at 12.5-16 ms (its p50 28 % under the plateau's); [75, 100) at 16-20 ms is within 10 %
    assert plateau_start(ramp) == 75
    point = steady_point(records(ramp))
    assert point["left_before"] == 75 and point["requests"] == 125
    assert point["window_s"] == [74 * 0.1 + 1.0, 199 * 0.1 + 1.0]  # from the end of the last request left out
    kept = sorted(ramp[75:])
    assert point["tpot_p90"] == kept[112] and point["tps_per_user"] == 1 / kept[112]
    assert point["system_tps"] == 125 * 10 / (199 * 0.1 - 74 * 0.1)
    assert point["ttft_p90"] == sorted(0.05 + i * 1e-4 for i in range(75, 200))[112]


def test_a_flat_run_is_steady_from_its_start_and_a_ramp_to_the_end_has_no_plateau():
    rng = random.Random(3)
    assert plateau_start([0.010 + rng.uniform(-3e-4, 3e-4) for _ in range(80)]) == 0
    still = steady_point(records([0.005 * 1.05 ** i for i in range(80)]))  # 5 % slower every request
    assert still == {"reason": f"no plateau: the last two of {BINS} bins' TPOT p50 or p90 differ by more than 10%"}
    assert steady_point(records([0.01] * 39)) == {"reason": "39 requests with a TPOT: a plateau needs 40"}
    # a warm-up, a failure or a request without a TPOT is no evidence
    mixed = records([0.01] * 40)
    mixed[0]["warmup"], mixed[1]["ok"], mixed[2]["tpot"] = True, False, None
    assert steady_point(mixed) == {"reason": "37 requests with a TPOT: a plateau needs 40"}
