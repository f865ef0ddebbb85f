"""Agent sessions replayed as they ran: `locust -f locustfiles/sessions.py --sessions TRACES [-u N]`.

Each user replays sessions one after another (-u is the session concurrency, as AIPerf's --concurrency for AgentX):
a session's turns go out in order, each when its predecessor completed plus its recorded delay (think time, or the
gap between the recorded calls; at most --max-idle), with a prompt of exactly the turn's input tokens whose content
is the blocks its hash ids name (the prefix cache sees the reuse the capture recorded), and exactly its output
tokens asked. A subagent forks beside its parent's session and the parent's next turn waits for it (unless it was
launched without waiting). Every request of a session carries its id in --session-header, so a router can keep it
on one replica; --capture-header NAME then tells the run's routing verdict which replica served it. A swarm splits
the sessions over its processes; the run ends when every session was replayed.

--session-start MIN,MAX (AgentX's t*): a server mostly serves sessions already under way, so each user's first
session starts at its first turn at or after t*, drawn uniformly in that share of the trace's recorded duration as
AIPerf draws it (seeded by --seed, 0 unset: the same draw run after run; sessions without recorded times, a
sessions JSONL, by that share of their turns). Each chain live at t* (the session, a subagent) is warmed first
with its last turn before it, which carries the chain's whole history so far: the server's cache holds the session
as it would at that point, and the warm-ups are logged but left out of the numbers. What ended before t* is not
sent; a user's later sessions start at their first turn. With --session-align instant, every user's
first session goes on at one instant, once every user of the process sent its warm-up (AIPerf aligns t* so).

--system-idle-cap S (AgentX's system-wide idle cap): while none of the process's requests is in flight, every pending
turn moves earlier by one amount, so the next goes S seconds after the system went idle, their spacing kept (each
session holds its next turn pending from the moment its last request ended). --recycle replays the sessions again
from their first turn once all were replayed (ids marked ~2, ~3..., each play's blocks its own under --cache-bust
trajectory) until -t, as AgentX's lanes do.

--scenario agentx-mvp / agentx set these rules as AIPerf's inferencex-agentx-mvp spec and its inferencex-agentx preset
do, abort a run past the preset's failed share and stamp it valid or not (docs/sessions.md); --sessions then also
takes a public set's published name.

Written only against vllm-load's public API: copy it to start your own.
"""

from __future__ import annotations

import math
import time
from typing import Any

import gevent
import gevent.event
from locust import task

from vllm_load import LLMUser
from vllm_load.workload.inputs.sessions import Fork, Session, Turn, read_sessions, replayed
from vllm_load.workload.inputs.t_star import start


class _Share:
    """This process's share of the sessions in one run, taken in turn by its users (again from the first, each play's
    ids and blocks its own, with --recycle)."""

    def __init__(self, sessions: list[Session], recycle: bool, cache_bust: bool) -> None:
        self.sessions, self.queue = sessions, list(sessions)
        self.left = len(sessions)  # sessions of the share not yet finished (never 0 while recycling)
        self.recycle, self.cache_bust, self.play = recycle and bool(sessions), cache_bust, 1

    def take(self) -> Session | None:
        if not self.queue and self.recycle:
            self.play += 1
            self.queue = [replayed(s, self.play, self.cache_bust) for s in self.sessions]
            self.left += len(self.queue)
        return self.queue.pop(0) if self.queue else None


class _Instant:
    """The one instant every user's first session goes on from (--session-align instant), once all have warmed."""

    def __init__(self) -> None:
        self.warmed = 0
        self.at = gevent.event.AsyncResult()


class SessionReplay(LLMUser):
    uses_options = frozenset({"sessions", "sessions_format", "max_idle", "session_start", "session_align", "scenario",
                              "cache_bust", "system_idle_cap", "recycle"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        from vllm_load import UsageError

        if not options.sessions:
            raise UsageError("locustfiles/sessions.py replays --sessions FILE (a Weka/AgentX trace file or folder, or "
                             "sessions JSONL: docs/sessions.md)")
        if not options.max_idle >= 0:
            raise UsageError(f"--max-idle {options.max_idle} must be >= 0")
        start_range(options.session_start)
        read_sessions(options.sessions, options.sessions_format)  # one line and exit 2 on a bad file

    @task
    def replay(self) -> None:
        share = self.llm.shared("sessions", self._take_share)
        first, self.started = not getattr(self, "started", False), True
        opts = self.llm.options
        aligned = first and opts.session_start and opts.session_align == "instant"
        # this user's next turn, pending from the end of its last request (--system-idle-cap: it is still to come)
        pending, self.pending = getattr(self, "pending", None) or self.llm.timer(), None  # _play lets it go on a failure
        session = share.take()
        if session is None:
            self.llm.cancel_timer(pending)
            if aligned:  # nothing to replay here: not waited for at the instant
                self._aligned()
            gevent.event.Event().wait()  # the share is replayed: wait for the run's end
            return
        try:
            if first and opts.session_start:
                session = self._warm(session, start_range(opts.session_start))
            _end, self.pending = self._play(session, self._aligned() if aligned else time.time(), pending)
        finally:
            share.left -= 1
            if share.left == 0:
                self.llm.finished()

    def _aligned(self) -> float:
        """--session-align instant (AIPerf's t*): this user's warm-up is done; wait until every user of this process
        has said so, and return that one instant, from which every first session's next turn is due."""
        align = self.llm.shared("t*", _Instant)
        align.warmed += 1
        if align.warmed >= self.environment.runner.target_user_count and not align.at.ready():
            align.at.set(time.time())
        return align.at.get()

    def _take_share(self) -> _Share:
        """A run's first replay here reads the sessions and takes this process's share (none: it is done at once)."""
        o = self.llm.options
        bust = o.cache_bust == "trajectory"
        share = _Share(self.llm.share(read_sessions(o.sessions, o.sessions_format, bust)), bool(o.recycle), bust)
        if not share.queue:
            self.llm.finished()
        return share

    def _warm(self, session: Session, ratios: tuple[float, float]) -> Session:
        """AgentX's t*: the session from t* (drawn in ``ratios`` of the trace's recorded duration as AIPerf draws it,
        seeded by --seed, 0 unset; by the turns' share without recorded times: workload/inputs/t_star.py), after each
        chain live at t* (the session, a subagent) is warmed with its last turn before it, all at once and left out of
        the numbers. Returns what is left to replay."""
        cut = start(session, ratios, max(0, int(self.llm.options.seed)))
        warm = [gevent.spawn(self._warm_one, sid, turn, session.block_size) for sid, turn in cut.warm]
        gevent.joinall(warm, raise_error=True)
        return cut.rest

    def _warm_one(self, sid: str, turn: Turn, block_size: int) -> None:
        with self.llm.session(sid):
            self.llm.send(self.llm.turn_request(turn.input_tokens, turn.output_tokens, hash_ids=turn.hash_ids,
                                                block_size=block_size), name="warm-up", warmup=True)

    def _play(self, session: Session, ready_at: float, pending: Any) -> tuple[float, Any]:
        """One session: its turns in order, each after its predecessor's completion plus its delay; its subagents
        in greenlets of their own (their own session ids), joined where the recording waited for them. ``pending``
        is its first turn's timer (``self.llm.timer()``), each later one taken as the turn before it returns. Returns
        when its last answer ended, and the timer of what comes next."""
        cap = float(self.llm.options.max_idle)
        forks: list[gevent.Greenlet] = []
        try:
            with self.llm.session(session.id):
                for step in session.steps:
                    if isinstance(step, Fork):
                        child = gevent.spawn(self._subagent, step.session, step.join)
                        if step.join:
                            forks.append(child)
                        continue
                    ready = self.llm.turn_request(step.input_tokens, step.output_tokens, hash_ids=step.hash_ids,
                                                  block_size=session.block_size)  # built while the turn waits
                    if forks:  # the turn after a subagent waits for it: its delay counts from the later end
                        ready_at = max(ready_at, self._join(forks, pending))
                        forks = []
                    pending.at = ready_at + min(step.delay, cap)
                    reply = self.llm.send_at(ready, pending, name="subagent" if "::" in session.id else "turn")
                    pending = self.llm.timer()  # the next turn, pending before anything else runs
                    ready_at = reply.end or time.time()
                self._join(forks, pending)
        except BaseException:
            self.llm.cancel_timer(pending)
            raise
        return ready_at, pending

    def _subagent(self, session: Session, join: bool) -> tuple[float, Any]:
        """A subagent's session (its first turn pending from its launch). One its parent does not wait for lets go
        of its last timer itself; a joined one's is the parent's to let go once it has taken over (``_join``)."""
        end, pending = self._play(session, time.time(), self.llm.timer())
        if not join:
            self.llm.cancel_timer(pending)
        return end, pending

    def _join(self, forks: list[gevent.Greenlet], pending: Any) -> float:
        """Wait for the subagents the next turn waits on, and return when the last ended. Meanwhile the parent's
        turn is not imminent (it comes after theirs: due never, so an idle shift moves their timers); each ended
        subagent's last timer holds the system busy until the parent's due time is set."""
        pending.at = math.inf
        gevent.joinall(forks)
        pending.at = -math.inf
        for f in forks:
            if f.value:
                self.llm.cancel_timer(f.value[1])
        return max((f.value[0] for f in forks if f.value), default=-math.inf)

    def on_stop(self) -> None:
        if getattr(self, "pending", None) is not None:
            self.llm.cancel_timer(self.pending)


def start_range(text: str) -> tuple[float, float]:
    """--session-start MIN,MAX: two fractions, 0 <= MIN <= MAX <= 1."""
    from vllm_load import UsageError

    if not text:
        return (0.0, 0.0)
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--session-start {text!r}: give MIN,MAX, two fractions of a session's turns (e.g. 0,1)") \
            from None
    if not 0 <= low <= high <= 1:
        raise UsageError(f"--session-start {text!r}: need 0 <= MIN <= MAX <= 1")
    return (low, high)
