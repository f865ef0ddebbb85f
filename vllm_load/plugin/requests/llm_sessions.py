"""``self.llm``'s calls for replayed sessions and a locustfile's own schedule: a turn of exact length built from
kept blocks, a send at a given time (timed from it), this process's share of a list, state shared per run, the
end of this process's share, and the session id every request inside ``session()`` carries."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import gevent
from gevent import getcurrent

from vllm_load.client.reply import Reply
from vllm_load.client.stream import ReadyRequest, ready_request
from vllm_load.plugin.load.idle_shift import Pending
from vllm_load.workload.block_reuse import BlockReuse


@dataclass(frozen=True)
class Due:
    """Open loop: when the task started by one arrival should have sent its first request."""

    intended: float  # perf_counter time
    schedule_start: float  # when the schedule (the run's, or a sweep step's rate) began


#: each load process's memory of the blocks its prompts sent (its request source's: one per process)
_SENT: weakref.WeakKeyDictionary[Any, BlockReuse] = weakref.WeakKeyDictionary()


def _turn_request(src: Any, input_tokens: int, output_tokens: int, hash_ids: tuple[int, ...], block_size: int,
                  model: str, group: str | None) -> ReadyRequest:
    """A session turn's request, in the prompt thread: the blocks' content at its exact length, or unique text;
    with the blocks, the tokens an earlier prompt of this process sent ahead of it (what a prefix cache could hit)."""
    f = src.factory("chat")
    if not hash_ids:
        return ready_request("chat", model, f.make(input_tokens), output_tokens, src.defaults, group)
    prompt = f.from_blocks(hash_ids, block_size, input_tokens)
    sent = _SENT.get(src)
    if sent is None:
        sent = _SENT[src] = BlockReuse()
    reusable = sent.send(hash_ids, block_size, input_tokens - f.overhead)  # the verdict keeps the last token out
    return dataclasses.replace(ready_request("chat", model, prompt, output_tokens, src.defaults, group),
                               reusable=reusable)


class SessionCalls:
    """A part of ``LLM`` (``plugin/requests/llm.py``): it needs ``_source()``, ``_generator()``, ``_live_generator()``, ``send()``
    and the per-greenlet ``_due`` and ``_sessions`` from there."""

    _source: Any
    _generator: Any
    _live_generator: Any
    send: Any
    _due: dict
    _sessions: dict

    def turn(self, input_tokens: int, output_tokens: int, *, hash_ids: tuple[int, ...] | list[int] = (),
             block_size: int = 64, name: str | None = None, headers: dict[str, str] | None = None) -> Reply:
        """One streaming chat request of a replayed session's turn: a prompt of exactly ``input_tokens`` tokens
        (the chat template included) whose content is the blocks ``hash_ids`` name, in order (the same id, the same
        ``block_size`` tokens of content for the whole run, so two turns share exactly the blocks their ids share,
        as the server's prefix cache sees them), and exactly ``output_tokens`` tokens asked. Built off the event
        loop."""
        return self.send(self.turn_request(input_tokens, output_tokens, hash_ids=hash_ids, block_size=block_size),
                         name=name, headers=headers)

    def turn_request(self, input_tokens: int, output_tokens: int, *, hash_ids: tuple[int, ...] | list[int] = (),
                     block_size: int = 64) -> ReadyRequest:
        """``turn``'s request, built (off the event loop) but not sent: a replay builds the next turn while it
        waits for its time, then ``send``s it (a 128k-token turn of kept blocks: ~1.6 ms of CPU,
        benchmarks/long_context.py)."""
        src = self._source()
        model, group = src.next_model()
        return src.offload(_turn_request, src, int(input_tokens), int(output_tokens), tuple(hash_ids),
                           int(block_size), model, group)

    def timer(self, at: float = -math.inf) -> Pending:
        """A session's next turn, pending from now, for ``send_at``; set its ``at`` once its due time is known. Take
        it before the request it follows returns: --system-idle-cap then sees a turn still to come (imminent until
        its ``at`` is set) and never moves the other turns past it."""
        shift = self._generator().idle_shift
        return shift.timer(at) if shift is not None else Pending(at)

    def cancel_timer(self, pending: Pending) -> None:
        """A ``timer`` whose turn will not be sent (also as the run stops: it never parks)."""
        gen = self._live_generator()
        shift = gen.idle_shift if gen is not None else None
        if shift is not None:
            shift.cancel(pending)

    def send_at(self, ready: ReadyRequest, at: float | Pending, *, name: str | None = None,
                headers: dict[str, str] | None = None, warmup: bool = False) -> Reply:
        """Send ``ready`` at the wall-clock time ``at`` (at once, if that has passed), timed from ``at``: a send
        the client made late counts its lateness in the request's latency and its ``send_lag``, as an open loop's
        arrival does (a replay's turn is due at its predecessor's completion plus its delay). ``at`` may be a
        ``timer``: --system-idle-cap may then move it earlier while the process is idle."""
        gen = self._generator()
        shift = gen.idle_shift
        if shift is not None:
            due = shift.wait(at if isinstance(at, Pending) else shift.timer(at))
        else:
            due = at.at if isinstance(at, Pending) else at
        wait = due - time.time()
        if wait > 0:
            gevent.sleep(wait)
        self._due[getcurrent()] = Due(time.perf_counter() - (time.time() - due), gen.schedule_start())
        return self.send(ready, name=name, headers=headers, warmup=warmup)

    def share(self, items: list[Any]) -> list[Any]:
        """This load process's part of ``items`` (item i where i mod the run's processes is its index): a swarm
        splits sessions, each kept whole on one process."""
        gen = self._generator()
        n = max(1, gen.plan.processes)
        return [x for i, x in enumerate(items) if i % n == gen.worker_index % n]

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """What this process's users share during one run (a locustfile's own state: the sessions it replays), made
        by ``make()`` at the run's first call and gone with the run: a new run (the web UI's next start) starts over,
        and each process of a swarm (a worker in a test's process too) has its own."""
        shared = self._generator().shared
        if key not in shared:
            shared[key] = make()
        return shared[key]

    def finished(self) -> None:
        """This process sent all of its share (and every request came back): the run ends once every process
        has said so (as a trace replay ends)."""
        gen = self._live_generator()
        if gen is None or gen.draining:  # the run is ending (a user stopped mid-session, in its finally): it parked
            return  # here, in a greenlet Locust was killing, and the run never ended (sessions.py -t 4s)
        gevent.spawn(lambda: (gen.idle.wait(), gen.on_trace_done()))

    @contextlib.contextmanager
    def session(self, session_id: str | None = None) -> Iterator[str]:
        """Every request sent inside carries ``session_id`` in --session-header (X-Session-ID: the key vLLM's
        router hashes to keep a session on one replica); without one, a new id unique in the swarm. Yields it."""
        sid = session_id if session_id is not None else f"{self._generator().source}-{uuid.uuid4().hex[:12]}"
        me = getcurrent()  # per greenlet: a subagent's greenlet beside its parent has a session of its own
        before = self._sessions.get(me)
        self._sessions[me] = sid
        try:
            yield sid
        finally:
            if before is None:
                self._sessions.pop(me, None)
            else:
                self._sessions[me] = before

