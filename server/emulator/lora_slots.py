"""vLLM's LoRA slots (``--max-loras N``): at most N adapters loaded at once, the least recently used one evicted for
the next; a request for an adapter not loaded waits for its load (``--lora-load-seconds``) before its prefill, as an
adapter beyond vLLM's slots is loaded again (vllm-metal #641; sglang #13349: 16 adapters over 8 slots took median
TTFT from 39.65 ms to 6,278 ms). Each load is counted in ``vllm_emulator:lora_loads_total{lora_name}`` (the truth an
adapter-churn verdict is held to), and the slots are said as vLLM says them, in ``vllm:lora_requests_info``'s
``max_lora`` label (its ``running_lora_adapters`` here: the adapters loaded)."""

from __future__ import annotations

import time
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Gauge


class LoraSlots:
    def __init__(self, slots: int, load_seconds: float, registry: CollectorRegistry) -> None:
        self.slots, self.load_seconds = slots, load_seconds
        self.loaded: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.loads = Counter("vllm_emulator:lora_loads", "LoRA adapters loaded into a slot (the first time, or again "
                             "after an eviction).", ["lora_name"], registry=registry)
        self.info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                          ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=registry)
        self._said()

    def use(self, adapter: str) -> float:
        """The seconds a request for ``adapter`` waits for its load (0: loaded already), the slots updated."""
        if adapter in self.loaded:
            self.loaded.move_to_end(adapter)
            return 0.0
        self.loaded[adapter] = None
        if len(self.loaded) > self.slots:
            self.loaded.popitem(last=False)
        self.loads.labels(lora_name=adapter).inc()
        self._said()
        return self.load_seconds

    def _said(self) -> None:
        self.info.clear()
        self.info.labels(max_lora=str(self.slots), waiting_lora_adapters="",
                         running_lora_adapters=",".join(self.loaded)).set(time.time())
