"""What a deciding process (a local runner, a master) serves or starts for its runs: the OTLP span receiver
(--otlp-receiver), with no --host the embedded emulator and its sidecar, and the LoRA adapters it loads into the
targets (--load-lora); all of it lives as long as the process."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from vllm_load.plugin.prepare import lora_adapters
from vllm_load.runtime.embedded import Children, Served, emulator_args, emulator_mode, private_temp_file


class Servers:
    """Built from the run's options and how children are started (``Children``: processes on the command line,
    served in the process by ``vllm_load.testing``); ``start`` once, ``stop`` at the end."""

    def __init__(self, children: Children) -> None:
        self.children = children
        self.emulator: Served | None = None
        self.emulator_log: Path | None = None  # the embedded emulator's log (copied into each run directory)
        self.sidecar: Served | None = None
        self.sidecar_url = ""  # --sidecar-url, or the embedded emulator's sidecar
        self.span_receiver: Any = None  # --otlp-receiver (span_receiver.SpanReceiver)
        self.adapters: Any = None  # --load-lora (lora_adapters.LoraAdapters)

    def start(self, opts: Any, host: str | None) -> str | None:
        """--otlp-receiver, then (no ``host``) the embedded emulator and its sidecar, then --load-lora's adapters on
        every target; the emulator's URL, if one."""
        url = self._start(opts, host)
        specs = lora_adapters.parse_specs(getattr(opts, "load_lora", None))
        if specs:
            from vllm_load.plugin.prepare.validate import split_hosts

            self.adapters = lora_adapters.LoraAdapters(split_hosts(url or host), opts.api_key,
                                                       lambda line: print(line, flush=True))
            # unloaded at the run's end (``release``), and on any other way out of the process (a failed start-up's
            # exit, a signal's): the quitting path alone never did, and the adapters stayed on the server
            atexit.register(self.adapters.unload)
            self.adapters.load(specs)
        return url

    def _start(self, opts: Any, host: str | None) -> str | None:
        self.sidecar_url = opts.sidecar_url
        if opts.otlp_receiver:  # before the embedded emulator: it exports its spans there
            from vllm_load.plugin.sources.span_receiver import SpanReceiver

            self.span_receiver = SpanReceiver(opts.otlp_receiver)
            print(self.span_receiver.banner(), flush=True)
        if host:
            return None
        self.emulator_log = private_temp_file("emulator", ".log")
        spans = self.span_receiver.endpoint if self.span_receiver is not None else None
        self.emulator = self.children.emulator(emulator_args(opts, spans), self.emulator_log)
        print(f"vllm-load: no --host given: started the built-in vLLM EMULATOR at {self.emulator.url}, "
              f"{emulator_mode(opts)} (results describe the emulator, not a real vLLM)", flush=True)
        if not opts.sidecar_url:
            self.sidecar = self.children.sidecar(self.emulator.url, private_temp_file("sidecar", ".jsonl"))
            self.sidecar_url = self.sidecar.url
        return self.emulator.url

    def is_emulator(self, host: str | None) -> bool:
        return self.emulator is not None and host == self.emulator.url

    def release(self) -> None:
        """What the run put on the servers, taken back (once): --load-lora's adapters."""
        if self.adapters is not None:
            self.adapters.unload()

    def stop(self) -> None:
        self.release()  # before the emulator goes: it served them
        for child in (self.sidecar, self.emulator):
            if child:
                child.stop()
