"""A server that refuses this process's first requests all the same way is a setting to fix, not load to measure.

A remote worker started without its own key sent 10,127 ``HTTP 401`` in 8 s, and a body the server never takes
8,269 ``HTTP 400``: each answer comes back at once, so the users loop as fast as the loop turns, and the run ended
with a wall of failures and an exit code for failed requests. Here the first answers are watched until one succeeds:
the same refusal a few times in a row (auth: 3; any other 4xx but 429: 20), with nothing taken before it, stops the
run with one line naming the status, the server's words and what to change (exit 2, as every failure each request
would repeat). After a first success nothing is watched: a server that starts refusing mid-run is measured.
"""

from __future__ import annotations

from typing import Any, Callable

from vllm_load.client.record import RequestRecord
from vllm_load.errors import EXIT_BAD_INPUT

#: refusals in a row, with no success before them, that stop the run: a key that is refused never becomes right
IN_A_ROW = {401: 3, 403: 3}
#: the same for any other 4xx (429 aside: an overloaded server, backed off and measured)
OTHER = 20
#: request fields a server that is not vLLM may refuse, and the switch that leaves each out
SWITCHES = {"min_tokens": "--no-ignore-eos", "ignore_eos": "--no-ignore-eos",
            "continuous_usage_stats": "--no-continuous-usage", "stream_options": "--no-continuous-usage"}


class Refusals:
    """This process's first answers, until one succeeds; ``on_fatal`` is told once."""

    def __init__(self, on_fatal: Callable[[str, int], Any], worker: bool, keyed: bool) -> None:
        self.on_fatal, self.worker, self.keyed = on_fatal, worker, keyed
        self.status: int | None = None
        self.count = 0
        self.done = False

    def add(self, rec: RequestRecord) -> None:
        if self.done:
            return
        if rec.ok:
            self.done = True  # the server takes these requests: what it refuses later is measured
            return
        status = rec.status
        if status is None or not 400 <= status < 500 or status == 429 or rec.cancelled:
            return  # not a refusal of the request itself (a connection, an overload, the run's end)
        if status != self.status:
            self.status, self.count = status, 0
        self.count += 1
        if self.count >= IN_A_ROW.get(status, OTHER):
            self.done = True
            self.on_fatal(self.message(status, rec.error or ""), EXIT_BAD_INPUT)

    def message(self, status: int, said: str) -> str:
        said = " ".join(said.split()).removeprefix(f"HTTP {status}: ")[:200]
        switches = sorted({switch for name, switch in SWITCHES.items() if name in said})
        if switches:
            fix = f"the server does not take a field vLLM takes: give {' and '.join(switches)}"
        elif status in IN_A_ROW:
            fix = ("this worker has no key: give it --api-key-file or VLLM_LOAD_API_KEY (the master sends none)"
                   if self.worker and not self.keyed else
                   "check --api-key-file, VLLM_LOAD_API_KEY or OPENAI_API_KEY" if self.keyed else
                   "the server wants a key: give --api-key-file, VLLM_LOAD_API_KEY or OPENAI_API_KEY")
        else:
            fix = "every request would be refused the same way: change what the server names"
        return f"the server refused the first {self.count} requests with HTTP {status} ({said}): {fix}"
