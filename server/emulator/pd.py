"""Disaggregated prefill/decode behind vLLM's router: a prefill instance answers where its KV is, a decode instance
pulls it (NIXL's metrics counted) before its first token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import gevent

if TYPE_CHECKING:
    from .app import Emulator
    from .plan import Output

#: an 8B Llama's KV per token (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes): a pull's bytes
KV_BYTES_PER_TOKEN = 131072


def pull_kv(emu: Emulator, out: Output) -> float:
    """A decode instance (P/D): the prompt's KV pulled from its prefill instance, taking --kv-transfer-latency
    plus --kv-transfer-per-token per prompt token; the seconds it took (0 otherwise)."""
    if out.kv != "consume":
        return 0.0
    seconds = emu.kv_transfer[0] + emu.kv_transfer[1] * len(out.ids)
    gevent.sleep(seconds)
    xfer_time, xfer_bytes, _failed = emu.metrics.nixl()
    emu.metrics.l(xfer_time).observe(seconds)
    emu.metrics.l(xfer_bytes).observe(len(out.ids) * KV_BYTES_PER_TOKEN)
    return seconds


def kv_transfer_params(emu: Emulator, out: Output) -> dict:
    """What a prefill instance answers for its decode instance to pull the KV (vLLM's NIXL connector's fields)."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": emu.replica,
            "remote_block_ids": list(range(-(-len(out.ids) // emu.prefix_cache.block_size))),
            "remote_host": emu.replica.rsplit(":", 1)[0], "remote_port": 0, "tp_size": 1}
