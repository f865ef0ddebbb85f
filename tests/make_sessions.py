"""Agent sessions made for the tests: a generic sessions JSONL and Weka/AgentX trace files, with subagents,
blocks shared between turns (each turn repeats the last one's blocks and adds its own) and short delays."""

from __future__ import annotations

import json
import random
from pathlib import Path

BLOCK = 16


def turns_for(rng: random.Random, base: int, n: int) -> list[dict]:
    """``n`` turns whose hash ids grow: turn k repeats turn k-1's blocks, then adds 1-2 of its own."""
    ids: list[int] = [base]
    out = []
    for _ in range(n):
        ids = ids + [base + len(ids) + i for i in range(rng.randint(1, 2))]
        out.append({"input_tokens": BLOCK * len(ids) + 24, "output_tokens": rng.randint(2, 6),
                    "delay": round(rng.uniform(0.02, 0.15), 3), "hash_ids": list(ids)})
    return out


def sessions_jsonl(path: Path, count: int = 20, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    sessions = []
    for s in range(count):
        turns = turns_for(rng, 1000 * (s + 1), rng.randint(2, 4))
        if s % 3 == 0:  # a subagent after the first turn, joined by the second
            sub = {"session_id": f"s{s}::sa:1", "turns": turns_for(rng, 1000 * (s + 1) + 500, 2)}
            turns.insert(1, {"subagent": sub, "join": s % 2 == 0})
        sessions.append({"session_id": f"s{s}", "block_size": BLOCK, "turns": turns})
    path.write_text("".join(json.dumps(x) + "\n" for x in sessions))
    return sessions


def weka_traces(folder: Path, count: int = 20, seed: int = 2) -> list[dict]:
    """Weka traces (one JSON file each): calls at recorded times with think times, a subagent in every other."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    traces = []
    for s in range(count):
        t, requests = 0.0, []
        for k, turn in enumerate(turns_for(rng, 10 * (s + 1), rng.randint(2, 3))):
            if k == 1 and s % 2 == 0:
                inner = [{"t": t, "type": "s", "model": "m", "in": x["input_tokens"], "out": x["output_tokens"],
                          "hash_ids": x["hash_ids"], "api_time": 0.05} for x in turns_for(rng, 10 * (s + 1) + 5, 2)]
                requests.append({"t": t, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore",
                                 "status": "completed", "requests": inner, "models": ["m"]})
            requests.append({"t": round(t, 3), "type": "s", "model": "m", "in": turn["input_tokens"],
                             "out": turn["output_tokens"], "hash_ids": turn["hash_ids"], "api_time": 0.05,
                             "think_time": turn["delay"] if k else None})
            t += 0.05 + turn["delay"]
        trace = {"id": f"trace_{s:03d}", "models": ["m"], "block_size": BLOCK, "hash_id_scope": "local",
                 "requests": requests}
        (folder / f"trace_{s:03d}.json").write_text(json.dumps(trace))
        traces.append(trace)
    return traces
