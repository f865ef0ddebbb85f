"""Answers intact under load, adapter churn: a run whose --model mix names more LoRA adapters than the server has
slots says, per adapter, its TTFT against the base model's and the share of its requests that were its first since
it was last evicted (loaded again for them), and gates on the worst penalty: ``--slo 'lora_penalty<=50%'``.

Why: adapters beyond a server's slots are loaded again and again (vllm-metal #641; sglang #13349: 16 adapters over 8
slots took median TTFT from 39.65 ms to 6,278 ms); GuideLLM #1158 asks for it. vllm-load sent weighted adapter mixes
and judged none of this.

The slots are the server's own word where it says (``max_lora`` of vLLM's ``vllm:lora_requests_info``, read at the
run's end by ``plugin/sources/lora_slots.py``), else ``--max-loras``; which requests found their adapter evicted is
an LRU model of those slots over the request log, by start (vLLM counts no loads; the output says it is a model).
The base model and which ids are adapters are /v1/models' (an adapter's ``parent``), else the mix's first model is
taken for the base."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.feature_spec import Feature
from vllm_load.features.integrity import share_rows, wilson
from vllm_load.metric_table import TTFT
from vllm_load.option_spec import Option, group

#: the SLO's metric: the worst adapter's TTFT p50 over the base model's, less 1, as a percentage
METRIC = "lora_penalty"


def _p50(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def cold_requests(logs: list[dict[str, Any]], adapters: set[str], slots: int) -> list[bool]:
    """For each of the logs' requests of an adapter (by start): did it find its adapter unloaded, under an LRU model
    of ``slots`` slots (its adapter's first request, or its first since the model evicted it)?"""
    loaded: OrderedDict[str, None] = OrderedDict()
    out = []
    for r in sorted((r for r in logs if r.get("name") in adapters), key=lambda r: r["start"]):
        name = r["name"]
        if name in loaded:
            loaded.move_to_end(name)
            out.append(False)
            continue
        loaded[name] = None
        if len(loaded) > slots:
            loaded.popitem(last=False)
        out.append(True)
    return out


def churn(logs: list[dict[str, Any]], models: tuple[str, ...], server: Mapping[str, Any],
          given_slots: int) -> dict[str, Any] | None:
    """The part: per adapter its requests, loads (by the LRU model) and TTFT against the base model's."""
    said = list(server.get("adapters") or [])
    adapters = [m for m in models if m in said] if said else list(models[1:])
    base = str(server.get("base") or "") if said else models[0]
    slots, slots_from = ((int(server["slots"]), "the server's vllm:lora_requests_info") if server.get("slots")
                         else (given_slots, f"--max-loras {given_slots}") if given_slots else (0, ""))
    if not adapters or not slots or len(adapters) <= slots:
        return None if not adapters or len(adapters) <= slots else {"adapters": adapters, "slots": 0}
    # every request the server saw moves its slots (a warm-up's too); the figures are the measured requests'
    seen = sorted((r for r in logs if r.get("name") in set(adapters)), key=lambda r: r["start"])
    cold = dict(zip((id(r) for r in seen), cold_requests(seen, set(adapters), slots)))
    rows = [r for r in seen if not r.get("warmup")]
    base_ttft = _p50([r[TTFT] for r in logs if r.get("name") == base and r.get("ok") and r.get(TTFT) is not None])
    per: dict[str, Any] = {}
    for name in adapters:
        mine = [r for r in rows if r["name"] == name]
        ok = [r for r in mine if r.get("ok") and r.get(TTFT) is not None]
        p50 = _p50([r[TTFT] for r in ok])
        per[name] = {"requests": len(mine), "loads": sum(cold[id(r)] for r in mine), "ttft_p50": p50,
                     "cold_ttft_p50": _p50([r[TTFT] for r in ok if cold[id(r)]]),
                     "warm_ttft_p50": _p50([r[TTFT] for r in ok if not cold[id(r)]]),
                     "penalty": (p50 / base_ttft - 1.0) if p50 is not None and base_ttft else None}
    loads, total = sum(a["loads"] for a in per.values()), sum(a["requests"] for a in per.values())
    penalties = [a["penalty"] for a in per.values() if a["penalty"] is not None]
    return {"adapters": per, "base": base, "base_ttft_p50": base_ttft, "slots": slots, "slots_from": slots_from,
            "by": "an LRU model of the slots over the request log", "loads": loads, "requests": total,
            "share": loads / total if total else None, "interval": _interval(loads, total),
            "penalty": max(penalties) if penalties else None}


def _interval(loads: int, total: int) -> list[float]:
    lo, hi = wilson(loads, total)
    return [round(lo, 6), round(hi, 6)]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


class AdapterChurn(Feature):
    name = "adapter_churn"
    tone = "note"
    options = group(
        "answers checked",
        Option("--max-loras", 0, "the server's LoRA slots (vLLM's --max-loras), for the adapter-churn verdict of a "
               "--model mix with more adapters than slots, when the server does not say them (vLLM says them in "
               "vllm:lora_requests_info); 0: the server's word", type=int),
    )
    parts = ("plugin/sources/lora_slots.py",)
    at_end = "vllm_load.plugin.sources.lora_slots:at_end"
    slo_metrics = {METRIC: "%"}

    def validate(self, options: Any) -> None:
        if int(getattr(options, "max_loras", 0) or 0) < 0:
            raise UsageError(f"--max-loras {options.max_loras}: a slot count is >= 1 (0: the server's word)")

    def from_logs(self, logs: list[dict[str, Any]], options: Mapping[str, Any],
                  measured: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        models = tuple((measured or {}).get("models") or ())
        if len(models) < 2:
            return None
        return churn(logs, models, (measured or {}).get("server") or {}, int(options.get("max_loras") or 0))

    def slo_value(self, part: Mapping[str, Any], metric: str, name: str | None) -> tuple[float | None, str]:
        if not part or "adapters" not in part:
            return None, "no adapter churn: the mix's adapters fit the server's slots (or the mix names none)"
        if not part.get("slots"):
            return None, "the server's LoRA slots are unknown (it does not say them: give --max-loras N)"
        if part.get("penalty") is None:
            return None, "no base-model request to compare the adapters' TTFT with"
        return float(part["penalty"]), ""

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        if "adapters" not in part:  # the server's word alone (the run's end): its adapters fit its slots
            return []
        if not part.get("slots"):
            return [f"adapter churn: {len(part['adapters'])} adapters in the mix, the server's slots unknown (it does "
                    "not say them in vllm:lora_requests_info): give --max-loras N"]
        lo, hi = part["interval"]
        out = [f"adapter churn: {len(part['adapters'])} adapters over {part['slots']} slot(s) ({part['slots_from']}): "
               f"{part['loads']} of {part['requests']} adapter requests found theirs unloaded "
               f"({(part['share'] or 0) * 100:.1f} %, 95 % interval {lo * 100:.1f}-{hi * 100:.1f} %; {part['by']}); "
               f"the base model {part['base']}'s TTFT p50 {_ms(part['base_ttft_p50'])}"]
        for name, a in part["adapters"].items():
            pen = "" if a["penalty"] is None else f" ({a['penalty'] * 100:+.0f} %)"
            out.append(f"adapter churn: {name}: TTFT p50 {_ms(a['ttft_p50'])}{pen}, {a['loads']} of {a['requests']} "
                       f"loaded for them (loaded {_ms(a['cold_ttft_p50'])}, already loaded {_ms(a['warm_ttft_p50'])})")
        return out

    def compare_rows(self, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        return share_rows("lora_reloads", "adapter requests that loaded theirs", a, b)

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        return {METRIC: part["penalty"]} if part and part.get("penalty") is not None else {}


FEATURE = AdapterChurn()
