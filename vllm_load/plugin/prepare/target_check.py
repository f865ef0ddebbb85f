"""The target, checked before any load and again at a run's start when the web UI changed the host: each host
reachable, the model served, the tokenizer resolved, the prompt lengths possible for the APIs the users send
(``target.resolve_targets``). A headless run stops on a bad one with one line; a web UI shows why until it is fixed."""

from __future__ import annotations

import logging
from typing import Any, Callable

from vllm_load.client.apis.pooling import POOLING
from vllm_load.errors import UsageError, die
from vllm_load.plugin.prepare import startup, validate
from vllm_load.plugin.prepare.servers import Servers
from vllm_load.plugin.prepare.target import Target, resolve_targets
from vllm_load.report.load import lengths_text
from vllm_load.runtime.server_wait import wait_for_server

log = logging.getLogger("vllm_load")


class TargetCheck:
    def __init__(self, environment: Any, servers: Servers, apis: Callable[[], frozenset[str]]) -> None:
        self.environment, self.servers, self.apis = environment, servers, apis
        self.target: Target | None = None
        self.error: str | None = None  # the web UI's target failed its check: shown there until fixed

    def first(self, opts: Any, wait: float) -> None:
        """At start-up (after --wait-for-server), said in one line."""
        env = self.environment
        try:
            if wait > 0 and self.servers.emulator is None:
                for one in validate.split_hosts(env.host):
                    wait_for_server(one, wait, opts.api_key, say=lambda line: print(line, flush=True))
            target = self.check()
            apis = self.apis()
            lengths = (f"input {target.input_spec.text} tokens per text" if apis and apis <= POOLING
                       else lengths_text(getattr(opts, "__dict__", {}), target.input_spec.text, target.output_spec.text))
            print(f"vllm-load: target {target.host} ({target.kind}) model {target.model} tokenizer {target.tokenizer} "
                  f"(from {target.tokenizer_source}) max_model_len {target.max_model_len} {lengths}", flush=True)
            if target.server_kind == "openai":
                print(startup.openai_mode_line(target, opts), flush=True)
        except UsageError as exc:
            if env.web_ui is None or opts.headless:
                self.servers.stop()
                die(str(exc))
            # the web UI stays up with the error shown: the user fixes the host or the options there
            self.error = str(exc)
            log.error("vllm-load: %s (fix it in the web UI and start again)", exc)

    def check(self) -> Target:
        env = self.environment
        validate.check_options(env)  # the web UI may have changed them since start-up
        # check what this locustfile's users will send (a chat run against the chat template's minimum)
        self.target = resolve_targets(env.parsed_options, validate.split_hosts(env.host),
                                      self.servers.is_emulator(env.host), self.apis() or frozenset({"chat", "completions"}))
        return self.target

    def again(self) -> bool:
        """At a run's start: checked anew if the web UI changed the host since; False (and why, in ``error``) when
        it fails."""
        if self.target is not None and self.target.host == self.environment.host:
            return True
        try:
            self.check()
            self.error = None
            return True
        except UsageError as exc:
            self.error = str(exc)
            log.error("vllm-load: %s (fix it in the web UI and start again)", exc)
            return False
