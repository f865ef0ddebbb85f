"""Agent sessions made up from a few numbers, for when no trace fits: ``--sessions 'synthetic:sessions=50,turns=4-12,
first=2000-6000,growth=200-1500,output=40-300,think=0-3,subagents=0.25'``.

Each session is an agent's loop: a first prompt of ``first`` tokens (a system prompt of ``system`` tokens that
every session and subagent shares, then its own task), then turns whose prompt is the whole context so far (the
previous prompt, the previous answer, and ``growth`` new tokens: a tool's result, the user's next message), each
answered with ``output`` tokens, ``think`` seconds after the previous answer. The context is written as hash-id
blocks the way a Weka trace is: a turn's blocks are its predecessor's, extended, so the server's prefix cache sees
what an agent's context would give it (the growing prefix, hit; the new tail, missed), and a context that outgrows
the cache shows where it forgets (the KV-pressure curve of ``reuse.py``, without a trace). With ``subagents=P``
each turn is followed, with chance P, by a subagent: a session of its own (the shared system prompt, a fresh task,
``subagent_turns`` turns) the next turn waits for (``async=Q``: a share that does not wait).

Every load process makes the same sessions from the spec and its ``seed`` (``share`` splits them), so a swarm
replays one set.
"""

from __future__ import annotations

import math
import random
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.workload.lengths import LengthSpec, parse_length

PREFIX = "synthetic:"
#: key -> (default, kind): a length spec, a share in [0, 1], or a count
KEYS: dict[str, tuple[str, str]] = {
    "sessions": ("20", "count"), "turns": ("4-12", "length"), "system": ("1024", "length"),
    "first": ("1000-4000", "length"), "growth": ("200-1500", "length"), "output": ("40-300", "length"),
    "think": ("0-3", "seconds"), "subagents": ("0", "share"), "subagent_turns": ("2-5", "length"),
    "async": ("0", "share"), "block": ("64", "count"), "seed": ("1", "count"),
}
#: a context past this many tokens ends its session early (a model's window; the replay would be refused)
MAX_CONTEXT = 120_000


def is_synthetic(text: str) -> bool:
    return str(text).startswith(PREFIX)


def parse(text: str) -> dict[str, Any]:
    """The spec's values, each checked (one line naming the key on a bad one)."""
    given: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in str(text)[len(PREFIX):].split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in KEYS:
            raise UsageError(f"--sessions {text!r}: {part!r} is not KEY=VALUE of {', '.join(KEYS)}")
        given[key.strip()] = value.strip()
    out: dict[str, Any] = {}
    for key, (default, kind) in KEYS.items():
        value = given.get(key, default)
        out[key] = _value(text, key, value, kind)
    if out["sessions"] < 1 or out["block"] < 1:
        raise UsageError(f"--sessions {text!r}: sessions and block must be 1 or more")
    return out


def _value(text: str, key: str, value: str, kind: str) -> Any:
    try:
        if kind == "count":
            n = int(value)
            if n < 0:
                raise ValueError(value)
            return n
        if kind == "share":
            share = float(value)
            if not 0.0 <= share <= 1.0:
                raise ValueError(value)
            return share
        if kind == "seconds":
            low, _, high = value.partition("-")
            a, b = float(low), float(high or low)
            if not (math.isfinite(a) and math.isfinite(b) and 0 <= a <= b):
                raise ValueError(value)
            return (a, b)
        return parse_length(value, f"--sessions synthetic {key}")
    except (ValueError, UsageError):
        raise UsageError(f"--sessions {text!r}: {key}={value!r} is not a {kind} (e.g. {key}={KEYS[key][0]})") \
            from None


def make(text: str) -> list[Any]:
    """The sessions of a spec, the same in every process (its seed)."""
    from vllm_load.workload.inputs.sessions import Fork, Session, Turn

    spec = parse(text)
    rng = random.Random(f"synthetic/{spec['seed']}")
    block: int = spec["block"]
    # the shared system prompt's blocks are ids 1..n; every other block its own id, from 1 << 20 up
    system = list(range(1, 1 + math.ceil(spec["system"].sample(rng) / block)))
    ids = iter(range(1 << 20, 1 << 62))

    def fresh(tokens: int) -> list[int]:
        return [next(ids) for _ in range(math.ceil(tokens / block))]

    def session(name: str, turns: LengthSpec, depth: int) -> Session:
        context = system + fresh(spec["first"].sample(rng))
        steps: list[Any] = []
        for k in range(max(1, turns.sample(rng))):
            tokens = len(context) * block
            if tokens > MAX_CONTEXT:
                break
            out = spec["output"].sample(rng)
            think = 0.0 if k == 0 else rng.uniform(*spec["think"])
            steps.append(Turn(tokens, max(1, out), round(think, 3), tuple(context)))
            if depth == 0 and spec["subagents"] and rng.random() < spec["subagents"]:
                child = session(f"{name}.sub{k}", spec["subagent_turns"], depth + 1)
                steps.append(Fork(child, join=rng.random() >= spec["async"]))
            context = context + fresh(out + spec["growth"].sample(rng))  # the answer and what came back
        return Session(name, tuple(steps), block)

    return [session(f"synthetic-{i}", spec["turns"], 0) for i in range(spec["sessions"])]

