"""GPU telemetry as NVIDIA's DCGM exporter serves it, from a power model, so that energy per token is tested without a
GPU: ``GET /dcgm/metrics`` (with ``--dcgm``) answers in the exporter's names and units (power in W, energy in mJ since
start, utilization in %, framebuffer in MiB, SM clock in MHz) with its labels.

The model: one GPU drawing ``idle_w + per_seq_w`` per running sequence (at most ``max_w``). The engine calls
``advance`` before its running count changes, so the energy counter is the model's exact integral."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

#: the exporter's field names (dcgm-exporter's default counters)
POWER, ENERGY, UTIL, FB_USED, SM_CLOCK = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                          "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_SM_CLOCK")


@dataclass
class PowerModel:
    idle_w: float = 60.0
    per_seq_w: float = 4.0
    max_w: float = 400.0
    seqs_at_full: int = 64  # running sequences at which utilization reads 100 %
    energy_j: float = 0.0
    running: int = 0
    last: float = field(default_factory=time.perf_counter)

    def power(self, running: int) -> float:
        return min(self.max_w, self.idle_w + self.per_seq_w * running)

    def advance(self, running: int, now: float | None = None) -> None:
        """Charge the time since the last change at the running count that held over it, then take ``running``."""
        now = time.perf_counter() if now is None else now
        self.energy_j += self.power(self.running) * max(0.0, now - self.last)
        self.last, self.running = now, running

    def exposition(self, running: int) -> bytes:
        self.advance(running)
        labels = f'gpu="0",UUID="GPU-emulator-0",device="nvidia0",modelName="vLLM emulator",Hostname="{socket.gethostname()}"'
        util = min(100.0, 100.0 * running / self.seqs_at_full)
        rows = [(POWER, "gauge", "Power draw (in W).", self.power(running)),
                (ENERGY, "counter", "Total energy consumption since boot (in mJ).", self.energy_j * 1000.0),
                (UTIL, "gauge", "GPU utilization (in %).", util),
                (FB_USED, "gauge", "Framebuffer memory used (in MiB).", 20000.0 + 50.0 * running),
                (SM_CLOCK, "gauge", "SM clock frequency (in MHz).", 1410.0 if running else 210.0)]
        out = []
        for name, kind, doc, value in rows:
            out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value:.3f}"]
        return ("\n".join(out) + "\n").encode()
