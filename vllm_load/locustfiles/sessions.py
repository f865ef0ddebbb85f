"""Agent sessions replayed as they ran: `locust -f locustfiles/sessions.py --sessions TRACES [-u N]`.

Each user replays sessions one after another (-u is the session concurrency, as AIPerf's --concurrency for AgentX):
a session's turns go out in order, each when its predecessor completed plus its recorded delay (think time, or the
gap between the recorded calls; at most --max-idle), with a prompt of exactly the turn's input tokens whose content
is the blocks its hash ids name (the prefix cache sees the reuse the capture recorded), and exactly its output
tokens asked. A subagent forks beside its parent's session and the parent's next turn waits for it (unless it was
launched without waiting). Every request of a session carries its id in --session-header, so a router can keep it
on one replica; --capture-header NAME then tells the run's routing verdict which replica served it. A swarm splits
the sessions over its processes; the run ends when every session was replayed.

Written only against vllm-load's public API: copy it to start your own.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
import gevent.event
from locust import events, task

from vllm_load import LLMUser
from vllm_load.workload.sessions import Fork, Session, read_sessions

_queue: list[Session] | None = None  # this process's share, taken in turn by its users
_left = 0  # sessions of the share not yet finished


class SessionReplay(LLMUser):
    uses_options = frozenset({"sessions", "sessions_format", "max_idle"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        from vllm_load import UsageError

        if not options.sessions:
            raise UsageError("locustfiles/sessions.py replays --sessions FILE (a Weka/AgentX trace file or folder, or "
                             "sessions JSONL: docs/sessions.md)")
        if not options.max_idle >= 0:
            raise UsageError(f"--max-idle {options.max_idle} must be >= 0")
        read_sessions(options.sessions, options.sessions_format)  # one line and exit 2 on a bad file

    @task
    def replay(self) -> None:
        global _queue, _left
        if _queue is None:
            _queue = self.llm.share(read_sessions(self.llm.options.sessions, self.llm.options.sessions_format))
            _left = len(_queue)
            if not _queue:
                self.llm.finished()
        if not _queue:
            gevent.event.Event().wait()  # the share is replayed: wait for the run's end
        session = _queue.pop(0)
        try:
            self._play(session, time.time())
        finally:
            _left -= 1
            if _left == 0:
                self.llm.finished()

    def _play(self, session: Session, ready_at: float) -> float:
        """One session: its turns in order, each after its predecessor's completion plus its delay; its subagents
        in greenlets of their own (their own session ids), joined where the recording waited for them. Returns
        when its last answer ended."""
        cap = float(self.llm.options.max_idle)
        forks: list[gevent.Greenlet] = []
        with self.llm.session(session.id):
            for step in session.steps:
                if isinstance(step, Fork):
                    child = gevent.spawn(self._play, step.session, time.time())
                    if step.join:
                        forks.append(child)
                    continue
                ready = self.llm.turn_request(step.input_tokens, step.output_tokens, hash_ids=step.hash_ids,
                                              block_size=session.block_size)  # built while the turn waits
                if forks:  # the turn after a subagent waits for it: its delay counts from the later end
                    gevent.joinall(forks)
                    ready_at = max([ready_at, *(f.value for f in forks if f.value)])
                    forks = []
                reply = self.llm.send_at(ready, ready_at + min(step.delay, cap),
                                         name="subagent" if "::" in session.id else "turn")
                ready_at = reply.end or time.time()
            gevent.joinall(forks)
        return ready_at


@events.test_start.add_listener
def _new_run(**_kw: Any) -> None:
    """A new run (the web UI's next start) replays the sessions again."""
    global _queue
    _queue = None
