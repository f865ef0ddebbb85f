"""vLLM's profiler endpoints, emulated: ``POST /start_profile`` and ``/stop_profile`` answer only when the server was
started with ``--profiler-config`` (as vLLM's do); each profile's window and the requests that arrived in it are
written as a JSON file into its ``torch_profiler_dir``, where vLLM writes its torch traces."""

from __future__ import annotations

import json
import os
import time


class Profiler:
    def __init__(self, config: str) -> None:
        """``config``: vLLM's --profiler-config JSON, e.g. {"profiler": "torch", "torch_profiler_dir": "/traces"}."""
        conf = json.loads(config)
        if not isinstance(conf, dict) or not conf.get("torch_profiler_dir"):
            raise ValueError("--profiler-config needs a JSON object with torch_profiler_dir, e.g. "
                             '\'{"profiler": "torch", "torch_profiler_dir": "/tmp/traces"}\'')
        self.folder = os.path.abspath(str(conf["torch_profiler_dir"]))
        self.started: float | None = None
        self.requests = 0  # requests that arrived while it ran
        self.written = 0

    def start(self) -> None:
        if self.started is None:
            self.started, self.requests = time.time(), 0

    def saw_request(self) -> None:
        if self.started is not None:
            self.requests += 1

    def stop(self) -> None:
        if self.started is None:
            return
        os.makedirs(self.folder, exist_ok=True)
        self.written += 1
        path = os.path.join(self.folder, f"emulator-profile-{os.getpid()}-{self.written}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"start": self.started, "stop": time.time(), "requests": self.requests}, fh)
        self.started = None
