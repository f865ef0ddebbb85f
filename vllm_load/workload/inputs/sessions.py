"""Agent sessions to replay: turns paced by their predecessor's completion, subagents that fork and join.

Two formats:

- ``weka``: the Weka/AgentX capture AIPerf replays for SemiAnalysis' AgentX (a JSON object per trace file, a folder
  of them, or a trace per line as the published sets' ``traces.jsonl``): ``id``, ``block_size``, ``hash_id_scope`` (``local``: equal hash ids in different traces are different
  blocks; ``global``: shared), ``requests``: calls (``type`` ``n``/``s``: ``t`` seconds from the trace's start,
  ``in``/``out`` tokens, ``hash_ids``, ``api_time``, ``think_time``) and subagents (``type: subagent``: ``t``,
  ``agent_id``, ``status``, their own ``requests``). The parent's next call waits for a subagent to finish unless it
  was ``async_launched``.
- ``jsonl``: one session per line, documented in docs/sessions.md: ``{"session_id": "s1", "block_size": 16, "turns":
  [{"input_tokens": 1200, "output_tokens": 80, "delay": 1.5, "hash_ids": [1, 2, 3]}, {"subagent": {...a
  session...}, "join": true}, ...]}``. ``delay``: seconds after the previous turn's completion.

A turn's delay after its predecessor's completion is the recorded think time, else the gap between the previous
call's end (``t`` + ``api_time``) and this call's ``t`` (AIPerf's end-to-start delays), capped by ``--max-idle``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from vllm_load.errors import UsageError
from vllm_load.workload.inputs.input_files import MAX_LINE_BYTES, loads, read_text
from vllm_load.metric_table import INPUT_TOKENS, OUTPUT_TOKENS
from vllm_load.workload.inputs.public_sets import is_published, resolve
from vllm_load.workload.inputs.synthetic_sessions import is_synthetic, make

FORMATS = ("weka", "jsonl")


@dataclass(frozen=True)
class Turn:
    input_tokens: int
    output_tokens: int
    delay: float  # seconds after the previous turn's completion (the session's start, for its first)
    hash_ids: tuple[int, ...] = ()  # the prompt's content blocks: the same id, the same block, across the run
    at: float | None = None  # when the recording sent it, seconds from its trace's start (Weka's t; None: not said)


@dataclass(frozen=True)
class Fork:
    """A subagent: a session of its own, started after the turn before it; ``join``: the next turn waits for it."""

    session: Session
    join: bool = True


Step = Union[Turn, Fork]


@dataclass(frozen=True)
class Session:
    id: str
    steps: tuple[Step, ...]
    block_size: int = 64  # tokens per hash id

    def turns(self) -> int:
        """Every turn, its subagents' included."""
        return sum(s.session.turns() if isinstance(s, Fork) else 1 for s in self.steps)


def _fail(path: Path, what: str) -> UsageError:
    return UsageError(f"sessions {path}: {what}")


def guess_format(path: Path) -> str:
    return "jsonl" if path.suffix.lower() == ".jsonl" else "weka"


def read_sessions(path: str | Path, fmt: str = "", cache_bust: bool = False) -> list[Session]:
    """Every session of a file (or a folder of Weka traces, or a public set by its published name: public_sets.py),
    in order; bad input is one line (UsageError). ``synthetic:...``: sessions made up from a spec
    (synthetic_sessions.py). ``cache_bust``: each session tree's blocks its own (``own_blocks``)."""
    out = _read(path, fmt)
    return [own_blocks(s) for s in out] if cache_bust else out


def own_blocks(session: Session, tree: str = "") -> Session:
    """The session with every hash id namespaced by its tree (the root session's id, which its subagents share):
    AIPerf's AgentX first-turn cache bust, a marker unique to each trajectory before its first user turn, so that no
    trajectory's prompt shares a prefix with another's, even through ``global`` hash ids; within the tree the ids
    share as recorded (its warm-up turn, its subagents)."""
    tree = tree or session.id
    steps = tuple(Fork(own_blocks(st.session, tree), st.join) if isinstance(st, Fork)
                  else dataclasses.replace(st, hash_ids=tuple(_block(h, tree) for h in st.hash_ids))
                  for st in session.steps)
    return Session(session.id, steps, session.block_size)


def replayed(session: Session, play: int, cache_bust: bool = False) -> Session:
    """A session's ``play``-th replay (from 1) as a session of its own: its ids (and its subagents') marked with the
    play after the first, and with ``cache_bust`` its blocks its own for that play (a fresh marker on every play, as
    AgentX's lanes recycle their traces), so that no replay finds an earlier one's prompts in the server's cache."""
    out = session if play <= 1 else _renamed(session, f"~{play}")
    return own_blocks(out) if cache_bust else out


def _renamed(session: Session, mark: str) -> Session:
    steps = tuple(Fork(_renamed(st.session, mark), st.join) if isinstance(st, Fork) else st for st in session.steps)
    return Session(session.id + mark, steps, session.block_size)


def _read(path: str | Path, fmt: str) -> list[Session]:
    if is_synthetic(str(path)):
        return make(str(path))
    p = resolve(str(path)) if is_published(str(path)) else Path(path)
    if not p.exists():
        raise _fail(p, "no such file or folder: check --sessions")
    fmt = fmt or guess_format(p)
    if fmt not in FORMATS:
        raise UsageError(f"--sessions-format {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    out: list[Session] = []
    if fmt == "jsonl":
        out = _lines(p, weka=False)
    else:
        for f in sorted([*p.glob("*.json"), *p.glob("*.jsonl")]) if p.is_dir() else [p]:
            if f.suffix.lower() == ".jsonl":  # the published sets' layout: traces.jsonl, a trace per line
                out += _lines(f, weka=True)
                continue
            try:
                out.append(weka_session(loads(_text(f), f"sessions {f}")))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise _fail(f, f"is not a Weka trace ({type(exc).__name__}: {exc})") from None
    if not out:
        raise _fail(p, "holds no session")
    return out


def _lines(p: Path, weka: bool) -> list[Session]:
    """A session per line: vllm-load's own sessions, or Weka traces (a line with ``requests``: the public sets'
    ``traces.jsonl``, read line by line: they are 0.5-2 GB), each line bounded (``input_files.MAX_LINE_BYTES``)."""
    out = []
    try:
        with p.open("rb") as f:
            n = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                n += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise _fail(p, f"line {n} is longer than {MAX_LINE_BYTES >> 20} MiB: one session per line")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _fail(p, f"line {n} is not UTF-8 text") from None
                if not line.strip():
                    continue
                what = "Weka trace" if weka else "session"
                try:
                    obj = loads(line, f"sessions {p}: line {n}")
                    what = "Weka trace" if weka or "requests" in obj else what
                    out.append(weka_session(obj) if what == "Weka trace" else _jsonl_session(obj))
                except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
                    raise _fail(p, f"line {n} is not a {what} ({type(exc).__name__}: {exc}); see docs/sessions.md") \
                        from None
    except OSError as exc:
        raise _fail(p, f"cannot be read ({exc})") from None
    return out


def _text(p: Path) -> str:
    """A trace file's text, bounded (``input_files.read_text``: one trace, far under 256 MiB)."""
    return read_text(p, "sessions", "--sessions", None)


#: the largest block a trace may name (tokens per hash id): a bad value once reached the native code as a
#: negative size (SystemError); vLLM's own blocks are 16-128 tokens, Weka's traces 64
MAX_BLOCK = 1 << 20
#: a turn's tokens and a wait at most: sane maxima before they reach the run (10^30 tokens was an OverflowError)
MAX_TOKENS, MAX_WAIT_S = 1 << 24, 1e6


def _count(value: Any, what: str, least: int = 0, most: int | None = None) -> int:
    """A whole number from least to most: anything else is one line naming the field (``"in": 0`` raised in the
    user task, a ``block_size`` of -16 reached the C code)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()))):
        raise ValueError(f"{what} {value!r} is not a count")
    n = int(value)
    if n < least or (most is not None and n > most):
        raise ValueError(f"{what} {value!r} must be {least} or more" + (f" and {most} or less" if most else ""))
    return n


def _hash_ids(values: Any) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"hash_ids {values!r} is not a list")
    return tuple(_count(h, "a hash id") for h in values)


def _seconds(value: Any, what: str) -> float:
    s = float(value)
    if not math.isfinite(s) or s < 0 or s > MAX_WAIT_S:
        raise ValueError(f"{what} {value!r} is not a time (0 to {MAX_WAIT_S:g} s)")
    return s


def _jsonl_session(obj: dict, block_size: int | None = None) -> Session:
    size = _count(obj["block_size"], "block_size", 1, MAX_BLOCK) if "block_size" in obj else block_size or 64
    steps: list[Step] = []
    for i, turn in enumerate(obj["turns"], 1):
        if "subagent" in turn:
            steps.append(Fork(_jsonl_session(turn["subagent"], size), bool(turn.get("join", True))))
            continue
        try:
            steps.append(Turn(_count(turn[INPUT_TOKENS], INPUT_TOKENS, 1, MAX_TOKENS),
                              _count(turn[OUTPUT_TOKENS], OUTPUT_TOKENS, 1, MAX_TOKENS),
                              _seconds(turn.get("delay", 0.0), "delay"), _hash_ids(turn.get("hash_ids") or ())))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"turn {i}: {exc}") from None
    if not any(isinstance(s, Turn) for s in steps):
        raise ValueError("a session has no turn")
    return Session(str(obj["session_id"]), tuple(steps), size)


def weka_session(trace: dict) -> Session:
    """A Weka trace as a session tree (hash ids namespaced by the trace when its scope is ``local``)."""
    scope = trace.get("hash_id_scope", "local")
    if scope not in ("local", "global"):
        raise ValueError(f"hash_id_scope {scope!r} is neither local nor global")
    salt = None if scope == "global" else str(trace["id"])
    return _weka_steps(str(trace["id"]), trace["requests"], _count(trace["block_size"], "block_size", 1, MAX_BLOCK),
                       salt)


def _block(h: int, salt: str | None) -> int:
    """A hash id in the run's one namespace: a local trace's ids are its own."""
    if salt is None:
        return int(h)
    return int.from_bytes(hashlib.blake2b(f"{salt}/{h}".encode(), digest_size=8).digest(), "big")


def _weka_steps(sid: str, requests: list, block_size: int, salt: str | None) -> Session:
    steps: list[Step] = []
    prev_end: float | None = None  # when the previous call ended (t + api_time), on the trace's clock
    for i, req in enumerate(requests, 1):
        try:
            step = _weka_step(sid, req, block_size, salt, prev_end)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{sid} call {i}: {exc}") from None
        if isinstance(step, Fork):
            steps.append(step)
            continue
        turn, prev_end = step
        steps.append(turn)
    if not any(isinstance(s, Turn) for s in steps):
        raise ValueError("a trace has no call")
    return Session(sid, tuple(steps), block_size)


def _weka_step(sid: str, req: dict, block_size: int, salt: str | None,
               prev_end: float | None) -> Fork | tuple[Turn, float]:
    """One call of a trace (a turn, and when it ended on the trace's clock), or its subagent."""
    kind = req["type"]
    if kind == "subagent":
        child = _weka_steps(f"{sid}::sa:{req['agent_id']}", req["requests"], block_size, salt)
        return Fork(child, join=req.get("status") != "async_launched")
    if kind not in ("n", "s"):
        raise ValueError(f"request type {kind!r}")
    t = _seconds(req["t"], "t")
    if req.get("think_time") is not None:
        delay = _seconds(req["think_time"], "think_time")
    else:
        delay = max(0.0, t - prev_end) if prev_end is not None else 0.0
    end = t + _seconds(req.get("api_time") or 0.0, "api_time")
    turn = Turn(_count(req["in"], "in", 1, MAX_TOKENS), max(1, _count(req["out"], "out", 0, MAX_TOKENS)), delay,
                tuple(_block(h, salt) for h in _hash_ids(req.get("hash_ids") or ())), t)
    return turn, end


def share(sessions: list[Session], index: int, processes: int) -> list[Session]:
    """The sessions load process ``index`` of ``processes`` replays: session i when i mod processes is its index
    (a session, its subagents with it, stays on one process)."""
    return [s for i, s in enumerate(sessions) if i % max(1, processes) == index % max(1, processes)]
