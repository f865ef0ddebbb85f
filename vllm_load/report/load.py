"""The one line that says what load a run measured, at the head of its report and summary.md (the report named
its target twice and gave no users or rate, lengths or duration): who sent (users, or a rate and its arrivals, a
sweep, a trace, sessions), what (the asked lengths, or where the lengths came from), for how long (asked and run),
from how many load processes. Read from what the run kept (config.json's options and plan, the summary)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vllm_load.metrics.summary import RunSummary
from vllm_load.options import DEFAULT_INPUT_TOKENS, DEFAULT_OUTPUT_TOKENS


def _arrivals(burstiness: Any) -> str:
    b = float(burstiness if burstiness is not None else 1.0)
    if math.isinf(b):
        return "constant arrivals"
    return "Poisson arrivals" if b == 1.0 else f"gamma arrivals (burstiness {b:g})"


def _who(o: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
    users = o.get("num_users")
    if plan.get("sweep_kind") and plan.get("sweep_levels"):
        levels = ", ".join(format(float(v), "g") for v in plan["sweep_levels"])
        return f"a sweep over {'the request rate' if plan['sweep_kind'] == 'rate' else 'users'}: {levels}"
    if o.get("trace"):
        return f"a trace replayed at its timestamps (x{float(o.get('trace_speed') or 1.0):g})"
    if o.get("rate_schedule"):
        return f"a rate schedule ({o['rate_schedule']}), {users} users"
    if o.get("ramp_up_strategy"):
        return (f"a {o['ramp_up_strategy']} ramp from {o.get('ramp_up_start_rps', 0):g} to "
                f"{o.get('ramp_up_end_rps', 0):g} req/s")
    rate = float(o.get("request_rate") or 0.0)
    if rate > 0:
        return f"{rate:g} req/s open loop, {_arrivals(o.get('burstiness'))}, over {users} users"
    return f"{users} users, closed loop" if users is not None else ""


def lengths_text(o: Mapping[str, Any], input_text: str = "", output_text: str = "") -> str:
    """What lengths the run sent: the asked ones (``input_text``/``output_text`` as the target resolved them, else the
    options'), or where they came from (a trace's or sessions' own: the start-up line said "input 128 output 64"
    for a trace of other lengths)."""
    asked_in, asked_out = o.get("input_tokens"), o.get("output_tokens")  # the options' (--input-tokens, ...)
    if o.get("trace"):
        return "lengths from the trace"
    if o.get("sessions"):
        return "lengths from the sessions"
    if o.get("dataset"):
        return "prompts from --dataset" + (f", output {asked_out} tokens" if asked_out else "")
    return (f"input {input_text or asked_in or DEFAULT_INPUT_TOKENS} output "
            f"{output_text or asked_out or DEFAULT_OUTPUT_TOKENS} tokens")


def _how_long(o: Mapping[str, Any], s: RunSummary) -> str:
    asked = []
    if o.get("run_time"):
        asked.append(f"-t {float(o['run_time']):g} s")
    if o.get("num_requests"):
        asked.append(f"--num-requests {o['num_requests']}")
    ran = s.duration_s
    out = f"asked {' and '.join(asked)}, " if asked else ""
    out += f"ran {float(ran):.1f} s" if ran is not None else ""
    if ((s.features or {}).get("interrupted") or {}).get("by"):
        out += " (interrupted)"
    return out


def load_line(options: Mapping[str, Any] | None, summary: Mapping[str, Any],
              plan: Mapping[str, Any] | None = None) -> str:
    """``Load: 4 users, closed loop · input 128 output 64 tokens · asked -t 30 s, ran 30.2 s · 1 load process``."""
    o, p, s = options or {}, plan or {}, RunSummary.of(summary)  # summary.json's dict, or the report's RunSummary
    processes = len(s.workers or []) or int(p.get("processes") or 1)
    parts = [_who(o, p), lengths_text(o), _how_long(o, s), f"{processes} load process{'es' if processes > 1 else ''}"]
    return "Load: " + " · ".join(x for x in parts if x)
