"""Service-level objectives: parsing, per-request goodput, and the pass/fail verdict of a run.

An SLO is ``METRIC[NAME][.STAT] OP VALUE[UNIT]``, e.g. ``ttft.p99<=500ms``, ``itl.p95<40ms``,
``error_rate<=1%``, ``output_token_rate>=2000``, ``good_request_fraction>=95%``, ``goodput>=10``,
``server.preemptions<=0``. Names are vLLM's: ``itl`` is the gap between chunks, ``itl_token`` the per-token gap,
``e2el`` is accepted for ``e2e``.
They come from repeated ``--slo`` options or a YAML/TOML file (safe-loaded) holding either a list of
such strings under ``slo:`` or a mapping ``{"ttft.p99": "<=500ms"}``.

Goodput follows ``vllm bench serve``: a request is good when it meets every per-request SLO
(the thresholds given for ttft, tpot and e2e); goodput is good requests per second, and
``good_request_fraction`` their share (%) of the requests.
"""

from __future__ import annotations

import math
import operator
import sys
import re
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

from vllm_load.check import Check  # noqa: F401  (where the SLOs' readers find it)
from vllm_load.errors import UsageError
from vllm_load.features import FEATURES
from vllm_load import metric_table as table
from vllm_load.metrics.shape.breakdown import PARTS
from vllm_load.metric_table import E2E, ITL, OUTPUT_TPS, RTF
from vllm_load.metrics.summary import RunSummary, metric_stats

# the server's parts of each request's time (metrics/shape/breakdown.py) gate as latencies: server_queue.p99<=100ms
LATENCY = (*table.LATENCY, *PARTS)
#: per-request values that are not times, bounded by a statistic with no unit: output_tps.p10>=20, rtf.p99<=0.5
PER_REQUEST_RATIOS = (OUTPUT_TPS, RTF)
PER_REQUEST = table.GOODPUT  # goodput criteria, as in vllm bench serve: ttft, tpot, e2e
STATS = ("p50", "p90", "p95", "p99", "p99.9", "max", "mean", "min")
RUN_METRICS = {
    "error_rate": "%", "goodput": "req/s", "good_request_fraction": "%", "output_token_rate": "tok/s",
    "request_rate": "req/s",
    "input_drift": "tok", OUTPUT_TPS: "tok/s", "outage.seconds": "s",
    "energy_per_token": "J", "energy_per_request": "J",  # GPU telemetry (--dcgm-url)
    # a fault plan's disruption (metrics/fleet/disruption.py): each action's worst
    "lost_requests": "count", "recovery.seconds": "s", "rehomed_sessions": "count", "goodput_during_fault": "%",
    "accuracy": "%", "valid_output": "%"}  # --accuracy's graded answers; --response-format's valid JSON
_DISRUPTION = {m: m if m != "recovery.seconds" else "recovery_s" for m in
               ("lost_requests", "recovery.seconds", "rehomed_sessions", "goodput_during_fault")}
#: what --window steady judges on the steady window's requests (the rest is the run's: its outages, the server's
#: series, the routing, the server's per-request parts, the energy)
WINDOWED = frozenset({*table.LATENCY, "error_rate", "goodput", "good_request_fraction", "output_token_rate",
                      "request_rate", "input_drift", OUTPUT_TPS})
#: the features' own SLO metrics, by name: the feature that measures each
FEATURE_METRICS = {m: f for f in FEATURES for m in f.slo_metrics}
SERVER_METRICS = {
    "server.kv_cache_usage.max": "%", "server.preemptions": "count", "server.waiting.max": "count",
    "server.running.max": "count", "server.prefix_cache_hit_rate": "%",
}
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
}
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "%": 0.01, "": 1.0, "tok/s": 1.0, "req/s": 1.0, "tok": 1.0, "J": 1.0,
          "mJ": 1e-3}
_SPEC = re.compile(r"^\s*([a-z_][a-z0-9_.]*?)(?:\[([^\]]+)\])?(?:\.(p\d{1,2}(?:\.\d+)?|max|mean|min))?\s*"
                   r"(<=|>=|==|<|>)\s*([0-9]*\.?[0-9]+)\s*(ms|us|s|%|tok/s|req/s|tok|mJ|J)?\s*$")


@dataclass(frozen=True)
class SLO:
    text: str
    metric: str
    stat: str
    op: str
    threshold: float  # in base units: seconds, fractions, tokens/s, counts
    name: str | None = None  # ttft[turn 3].p99: judged on the requests of that name= only
    window: str = "run"  # --window: "steady" judges ``WINDOWED`` metrics on the steady window's requests
    #: a threshold relative to a baseline (``ttft.p99<=baseline*1.10``): ("*", 1.10), ("%", -0.05) for
    #: ``baseline-5%``, ("+", 0.02) for ``baseline+20ms``; its limit comes from the run's reference (``evaluate``)
    relative: tuple[str, float] | None = None

    def ok(self, value: float, limit: float | None = None) -> bool:
        return _OPS[self.op](value, self.threshold if limit is None else limit)

    def limit_of(self, baseline: float) -> float:
        """A relative SLO's limit, from the baseline's value of its metric."""
        how, amount = self.relative or ("*", 1.0)
        return baseline * amount if how == "*" else baseline * (1 + amount) if how == "%" else baseline + amount


#: spellings of an earlier release, kept one release with a one-line notice: (old, new, notice)
_DEPRECATED = {
    "itl_chunk": (ITL, "itl_chunk is now itl (vLLM's name for the gap between chunks); the per-token gap is itl_token"),
}
_ALIASES = {"e2el": E2E, "output_throughput": "output_token_rate"}  # vLLM's names, accepted as ours
_warned: set[str] = set()


def _deprecated(old: str, notice: str) -> None:
    if old not in _warned:
        _warned.add(old)
        sys.stderr.write(f"vllm-load: deprecated: {notice}\n")


_RELATIVE = re.compile(r"^\s*(.+?)\s*(<=|>=|<|>)\s*baseline\s*(?:([*+-])\s*([0-9]*\.?[0-9]+)\s*"
                       r"(ms|us|s|%|tok/s|req/s|tok)?)?\s*$")


def _parse_relative(text: str, m: re.Match[str]) -> SLO:
    """``METRIC OP baseline[*F | ±X%| ±X UNIT]``: the metric checked as an absolute SLO of the same statistic would
    be, its limit left to the baseline (a run judged without one cannot be judged)."""
    left, op, how, number, unit = m.groups()
    found: SLO | None = None
    for probe_unit in ("ms", ""):  # a latency needs a time unit, a rate none: the probe only checks the metric
        probe = f"{left}{op}1{probe_unit}"
        try:
            found = parse_slo(probe)
            break
        except UsageError as exc:
            why = str(exc).replace(repr(probe), repr(text.strip()))
    if found is None:
        raise UsageError(why)
    if how is None:
        relative = ("*", 1.0)
    elif how == "*":
        if unit:
            raise UsageError(f"SLO {text.strip()!r}: a factor takes no unit, e.g. {left}{op}baseline*1.10")
        relative = ("*", float(number))
    elif unit == "%":
        relative = ("%", (1 if how == "+" else -1) * float(number) / 100)
    else:
        if found.metric in LATENCY and unit not in ("ms", "s", "us"):
            raise UsageError(f"SLO {text.strip()!r} needs a time unit or %, e.g. {left}{op}baseline+20ms")
        relative = ("+", (1 if how == "+" else -1) * float(number) * _UNITS[unit or ""])
    return replace(found, text=text.strip(), threshold=math.nan, relative=relative)


def parse_slo(text: str) -> SLO:
    rel = _RELATIVE.match(text)
    if rel:
        return _parse_relative(text, rel)
    m = _SPEC.match(text)
    if not m:
        raise UsageError(f"SLO {text!r} is malformed: write METRIC[NAME][.pXX] OP VALUE[UNIT], e.g. ttft.p99<=500ms, "
                         "ttft[turn 3].p99<=300ms or, against the run's history, ttft.p99<=baseline*1.10")
    metric, name, stat, op = m.group(1), m.group(2), m.group(3) or "", m.group(4)
    value, unit = float(m.group(5)), m.group(6) or ""
    metric = _ALIASES.get(metric, metric)
    if metric in _DEPRECATED:
        new, notice = _DEPRECATED[metric]
        _deprecated(metric, notice)
        metric = new
    if metric == "goodput" and unit == "%":  # goodput was a share; vLLM's goodput is good requests/s
        _deprecated("goodput%", "goodput is now good requests per second, as vllm bench serve defines it: write "
                                "good_request_fraction>=95% for the share")
        metric = "good_request_fraction"
    if name is not None and (metric.startswith("server.") or metric == "outage.seconds" or metric in _DISRUPTION):
        raise UsageError(f"SLO {text!r}: {metric} belongs to the whole run, not to requests named {name!r}")
    if stat and f"{metric}.{stat}" in SERVER_METRICS:  # server.kv_cache_usage.max is one name
        metric, stat = f"{metric}.{stat}", ""
    if metric in LATENCY:
        if not stat:
            raise UsageError(f"SLO {text!r} needs a statistic: {metric}.p99, {metric}.p50, {metric}.max …")
        if unit not in ("ms", "s", "us"):
            raise UsageError(f"SLO {text!r} needs a time unit (ms, s or us), e.g. {metric}.{stat}<=500ms")
    elif metric in PER_REQUEST_RATIOS and stat:
        pass
    elif metric == RTF:
        raise UsageError(f"SLO {text!r} needs a statistic: rtf.p99<=0.5, rtf.p50 …")
    elif metric in FEATURE_METRICS:  # a feature's own (vllm_load/features/): a share in %
        if stat:
            raise UsageError(f"SLO {text!r}: {metric} takes no .{stat}")
        if unit not in ("%", ""):
            raise UsageError(f"SLO {text!r}: {metric} is a percentage, e.g. {metric}{op}99.9%")
        if unit == "":
            unit = "%" if value > 1 else ""
    elif metric in RUN_METRICS or metric in SERVER_METRICS:
        if stat:
            raise UsageError(f"SLO {text!r}: {metric} takes no .{stat}")
        expected = RUN_METRICS[metric] if metric in RUN_METRICS else SERVER_METRICS[metric]
        if expected == "%" and unit not in ("%", ""):
            raise UsageError(f"SLO {text!r}: {metric} is a percentage, e.g. {metric}{op}1%")
        if expected == "%" and unit == "":
            unit = "%" if value > 1 else ""
        if expected == "J" and unit == "mJ":
            pass
        elif expected not in ("%", "count") and unit not in ("", expected) and not (metric == "input_drift" and unit == "%"):
            raise UsageError(f"SLO {text!r}: {metric} is in {expected}, e.g. {metric}{op}10")
        if metric == "input_drift" and unit == "%":  # the share of requests that drifted, not tokens
            stat = "share"
    else:
        known = ", ".join(list(LATENCY) + [RTF] + list(RUN_METRICS) + list(FEATURE_METRICS) + list(SERVER_METRICS))
        raise UsageError(f"SLO {text!r} names an unknown metric {metric!r}: use one of {known}")
    return SLO(text.strip(), metric, stat, op, value * _UNITS[unit], name.strip() if name else None)


def load_slo_file(path: str) -> list[str]:
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"SLO file {path} cannot be read ({exc.strerror}): check --slo") from None
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            data: Any = tomllib.loads(raw)
        else:
            import yaml

            data = yaml.safe_load(raw)
    except Exception as exc:  # yaml.YAMLError / tomllib.TOMLDecodeError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"SLO file {path} does not parse ({first}): fix its syntax") from None
    if isinstance(data, dict) and "slo" in data:
        data = data["slo"]
    if isinstance(data, list) and all(isinstance(x, str) for x in data):
        return data
    if isinstance(data, dict):
        return [f"{k}{v}" if str(v)[:1] in "<>=" else f"{k}<={v}" for k, v in data.items()]
    raise UsageError(f"SLO file {path} must hold a list of 'metric<=value' strings or a mapping under 'slo'")


def parse_slo_option(values: list[str] | str | None, window: str = "run") -> list[SLO]:
    """``--slo`` values: each a file path (YAML/TOML) or one inline SLO (commas separate several), judged over
    ``window`` (--window)."""
    if not values:
        return []
    if isinstance(values, str):
        values = [values]
    texts: list[str] = []
    for v in values:
        if re.search(r"\.(ya?ml|toml)$", v.strip(), re.I) or Path(v).is_file():
            texts.extend(load_slo_file(v.strip()))
        else:
            texts.extend(t for t in v.split(",") if t.strip())
    slos = [replace(parse_slo(t), window=window) for t in texts]
    _refuse_clashes(slos)
    return slos


def _refuse_clashes(slos: list[SLO]) -> None:
    """Two SLOs on one statistic are a typo or a contradiction: one line names them."""
    seen: dict[tuple, SLO] = {}
    for s in slos:
        side = {"<=": "upper", "<": "upper", ">=": "lower", ">": "lower"}.get(s.op, "exact")
        key = (s.metric, s.stat, s.name, side, s.relative is not None)  # a fixed limit beside a baseline's: both
        other = seen.get(key)
        if other is not None:
            what = "twice" if other.threshold == s.threshold and other.op == s.op else "with two thresholds"
            raise UsageError(f"--slo gives {s.metric}{f'[{s.name}]' if s.name else ''}.{s.stat} {what} "
                             f"({other.text.strip()!r} and {s.text.strip()!r}): keep one")
        seen[key] = s
        opposite = seen.get((s.metric, s.stat, s.name, {"upper": "lower", "lower": "upper"}.get(side, side),
                             s.relative is not None))
        if opposite is not None and opposite is not s and s.relative is None:
            low, high = (opposite, s) if side == "upper" else (s, opposite)
            if low.threshold > high.threshold or (low.threshold == high.threshold and (low.op == ">" or high.op == "<")):
                raise UsageError(f"--slo {low.text.strip()!r} and {high.text.strip()!r} cannot both hold: fix one")


def goodput_thresholds(slos: list[SLO], name: str | None = None) -> dict[str, float]:
    """Per-request limits for goodput: the strictest upper bound given per ttft/tpot/e2e, for every request and, for a
    request of ``name``, its tier's too (``ttft[interactive].p99<=200ms`` beside ``ttft[batch].p99<=5s``: multi-tier SLO
    groups, each request judged by its own class's limits; a name with none and no run-wide ones is not judged)."""
    out: dict[str, float] = {}
    for s in slos:
        if s.metric in PER_REQUEST and s.op in ("<=", "<") and (s.name is None or s.name == name) and \
                s.relative is None:  # a request is judged by a fixed limit; a baseline's is the run's
            out[s.metric] = min(out.get(s.metric, float("inf")), s.threshold)
    return out



def _value(slo: SLO, summary: RunSummary, server: dict | None) -> tuple[float | None, str]:
    if slo.metric in FEATURE_METRICS:  # a feature's metric, read from its part (vllm_load/features/)
        feature = FEATURE_METRICS[slo.metric]
        part = (summary.features or {}).get(feature.name)
        return feature.slo_value(part or {}, slo.metric, slo.name)  # an empty part: the feature says why
    if slo.window == "steady" and slo.metric in WINDOWED:
        if slo.name is not None:
            return None, "the steady window keeps no per-name numbers: judge a named SLO over the run"
        if not summary.steady:
            return None, "no request ran in the steady window (every user sending, before the load wound down)"
        summary = summary.steady
    if slo.name is not None:
        named = (summary.names or {}).get(slo.name)
        if named is None:
            seen = ", ".join(repr(n) for n in (summary.names or {})) or "none"
            return None, f"no request was named {slo.name!r} (names measured: {seen})"
        summary = named
    if slo.metric in PARTS:
        part = summary.timing.parts.get(slo.metric) if summary.timing else None
        if not part:
            return None, ("the server gave no per-request times (vLLM: --enable-per-request-metrics; the embedded "
                          "emulator always does)")
        if part.at(slo.stat) is None:
            return None, f"the run computed no {slo.stat} of it (--metric-percentiles)"
        return float(part.at(slo.stat)), ""
    if slo.metric in LATENCY or (slo.metric in PER_REQUEST_RATIOS and slo.stat):
        m = metric_stats(summary, slo.metric)
        if not m.count:
            return None, "no successful request measured it"
        if m.at(slo.stat) is None:  # a saved run re-judged on a percentile it did not compute
            return None, f"the run computed no {slo.stat} of it (--metric-percentiles)"
        return float(m.at(slo.stat)), ""
    if slo.metric == "error_rate":
        return summary.error_rate, ""
    if slo.metric in ("goodput", "good_request_fraction"):
        if summary.get(slo.metric) is None:
            return None, f"no per-request SLO (ttft, tpot, e2e) to judge {slo.metric} by"
        return summary[slo.metric], ""
    if slo.metric == "input_drift":
        if slo.stat == "share":
            return float(summary.input_drift_fraction or 0.0), ""
        return float(summary.input_drift_max_abs), ""
    if slo.metric == "outage.seconds":
        return float(summary.outage_seconds or 0.0), ""
    if slo.metric in ("energy_per_token", "energy_per_request"):
        energy = summary.energy
        value = getattr(energy, "energy_per_output_token_j" if slo.metric == "energy_per_token" else
                        "energy_per_request_j", None)
        if value is None:
            return None, summary.energy_missing or "no GPU telemetry (give --dcgm-url)"
        return float(value), ""
    if slo.metric in ("accuracy", "valid_output"):
        found = summary.accuracy if slo.metric == "accuracy" else summary.valid_output
        return (float(found), "") if found is not None else (None, "no answer checked (--accuracy, --response-format)")
    if slo.metric in _DISRUPTION:
        value = (summary.disruption or {}).get(_DISRUPTION[slo.metric])
        if not summary.disruption:
            return None, "no fault plan ran (--fault, --fault-plan)"
        if value is None:
            return None, ("the fleet had not recovered when the run ended" if slo.metric == "recovery.seconds" else
                          "no request started between a fault and its recovery")
        return float(value), ""
    if slo.metric in ("output_token_rate", "request_rate", OUTPUT_TPS):
        return float(summary[slo.metric if slo.metric != OUTPUT_TPS else "output_token_rate"]), ""
    if not server:
        return None, "no server-side data (run the sidecar: --sidecar-url)"
    key = slo.metric[len("server."):]
    if key not in server or server[key] is None:
        return None, f"the server did not report {key}"
    return float(server[key]), ""


def _show(slo: SLO, value: float) -> str:
    if slo.metric in ("outage.seconds", "recovery.seconds"):
        return f"{value:.1f} s"
    if RUN_METRICS.get(slo.metric) == "count":
        return f"{value:.0f}"
    if slo.metric in LATENCY:
        return f"{value * 1000:.2f} ms"
    if slo.metric == "goodput":
        return f"{value:.2f} good req/s"
    if RUN_METRICS.get(slo.metric) == "J":
        return f"{value:.3f} J"
    if "%" in (SERVER_METRICS.get(slo.metric), RUN_METRICS.get(slo.metric)) or slo.stat == "share" or \
            slo.metric in FEATURE_METRICS:
        return f"{value * 100:.2f}%"
    return f"{value:.2f}"


def value_of(slo: SLO, summary: Mapping[str, Any], server: dict | None = None) -> float | None:
    """What ``slo`` measures in a run (None: the run did not measure it): a baseline's runs are read by it."""
    return _value(slo, RunSummary.of(summary), server)[0]


def _relative(s: SLO, value: float, ref: Mapping[str, Any] | None) -> Check:
    """A relative SLO judged against its reference: the baseline's value, its runs and spread (a feature's)."""
    if not ref or ref.get("baseline") is None:
        why = (ref or {}).get("why") or ("no baseline was taken for it when the run ended (a relative SLO is "
                                          "judged against the run's history as it stood then)")
        return Check(s.text, value, False, f"cannot judge: {why}")
    base, limit = float(ref["baseline"]), s.limit_of(float(ref["baseline"]))
    spread = float(ref.get("spread") or 0.0)
    change = (value - base) / base * 100 if base else 0.0
    beyond = "beyond the baseline's noise" if abs(value - base) > max(2 * spread, 0.001 * abs(base)) else \
        "within the baseline's noise"
    return Check(s.text, value, s.ok(value, limit), f"measured {_show(s, value)} against the baseline's "
                 f"{_show(s, base)} ({change:+.1f} %; {ref.get('said') or ''}): limit {_show(s, limit)}, {beyond}")


def evaluate(slos: list[SLO], summary: Mapping[str, Any], server: dict | None = None,
             references: Mapping[str, Mapping[str, Any]] | None = None) -> list[Check]:
    """Each SLO's check; a relative one's limit from ``references`` (by its text: the baseline's value, runs and
    spread, which a feature computed at the run's end)."""
    summary, checks = RunSummary.of(summary), []
    for s in slos:
        value, why = _value(s, summary, server)
        if value is None:
            checks.append(Check(s.text, None, False, f"cannot judge: {why}"))
        elif s.relative is not None:
            checks.append(_relative(s, value, (references or {}).get(s.text)))
        else:
            passed = s.ok(value)
            where = " in the steady window" if s.window == "steady" and s.metric in WINDOWED else ""
            checks.append(Check(s.text, value, passed, f"measured {_show(s, value)}{where}"))
    return checks
