"""Trace replay: every row once across the swarm, at its time, with its length and its prefix sharing."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT, run_in_process
from tests.make_trace import make_trace
from tests.test_e2e import load_run
from vllm_load.errors import UsageError
from vllm_load.workload.inputs.trace import read_trace, share

BLOCK = 16  # the emulator's prefix-cache block
TRACE_BLOCK = 512  # Mooncake's


@pytest.mark.quiet_cores  # "on time": each row's send against its due time
def test_a_mooncake_trace_replays_each_row_once_on_time_with_its_length_and_prefix_sharing(emulator_factory, tmp_path):
    rows = make_trace(tmp_path / "trace.jsonl", rows=120)  # 3.6 s of rows (200 took 6 s of the fast selection's tail)
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--enable-prompt-tokens-details")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "4", "-r", "4",
                          "--processes", "2", "--host", emu.url, "--trace", str(tmp_path / "trace.jsonl"),
                          "--run-dir", str(run_dir)], cwd=tmp_path, timeout=180)
    assert "the trace was replayed: stopping the run" in res.stdout  # it ends with the trace, no -t
    assert f"trace: {len(rows)} of {len(rows)} rows sent" in res.stdout
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    stats, logs = load_run(run_dir)
    # every row exactly once, split over the two workers
    assert sorted(r["trace_row"] for r in logs) == list(range(len(rows)))
    assert len({r["worker"] for r in logs}) == 2
    assert all(r["ok"] for r in logs)
    # each request's input and output length is its row's, exactly as the server counted them
    for r in logs:
        row = rows[r["trace_row"]]
        assert r["input_tokens"] == r["input_tokens_asked"] == row["input_length"]
        assert r["output_tokens"] == row["output_length"]
    # intended starts follow the timestamps: per worker, start - timestamp is one constant (its run start)
    for w in {r["worker"] for r in logs}:
        offsets = [r["start"] - rows[r["trace_row"]]["timestamp"] / 1000 for r in logs if r["worker"] == w]
        assert max(offsets) - min(offsets) < 0.002, (w, max(offsets) - min(offsets))
    # one run clock for both workers: every row's intended start is the same epoch plus its timestamp, so the
    # rows leave in trace order (two clocks once sent them 429 ms skewed: 40 inversions in 80 rows)
    epochs = [r["start"] - rows[r["trace_row"]]["timestamp"] / 1000 for r in logs]
    assert max(epochs) - min(epochs) < 0.002, max(epochs) - min(epochs)
    order = [r["trace_row"] for r in sorted(logs, key=lambda r: r["start"] + (r["send_lag"] or 0.0))]
    assert sum(a > b for a, b in zip(order, order[1:])) == 0
    clock = stats["summary"]["clock"]  # each worker's offset to the master's clock: one host, one clock
    assert len(clock) == 2 and all(abs(c["offset_ms"]) <= c["uncertainty_ms"] + 0.5 for c in clock.values()), clock
    assert stats["summary"]["metrics"]["send_lag"]["count"] + stats["summary"]["metrics"]["send_lag_startup"]["count"] == len(rows)
    # prefix sharing as the hash ids predict: the blocks shared with a row sent earlier are in the cache
    sent = sorted(logs, key=lambda r: r["start"] + (r["send_lag"] or 0.0))
    checked = 0
    for k, r in enumerate(sent):
        t = r["start"] + (r["send_lag"] or 0.0)
        mine = rows[r["trace_row"]]["hash_ids"]
        earlier = [rows[o["trace_row"]]["hash_ids"] for o in sent[:k] if o["start"] + (o["send_lag"] or 0) < t - 0.005]
        close = [o for o in sent if o is not r and abs(o["start"] + (o["send_lag"] or 0) - t) <= 0.005
                 and _common(mine, rows[o["trace_row"]]["hash_ids"])]
        if close:
            continue  # two rows sharing blocks sent within 5 ms: which one the server saw first is a race
        common = max((_common(mine, e) for e in earlier), default=0)
        predicted = min(common * TRACE_BLOCK, r["input_tokens"])
        # within the chat template's tokens and one cache block
        assert abs(r["cached_tokens"] - predicted) <= BLOCK + 8, (r["trace_row"], r["cached_tokens"], predicted)
        checked += 1
    assert checked >= 114  # 95 % of the rows
    html = (run_dir / "report.html").read_text()
    assert "id='options-changed'" in html and "trace" in html.split("id='options-changed'")[1].split("</div>")[0]
    # the trace's reuse reached the server: the rows of a document after its first
    assert sum(r["cached_tokens"] >= TRACE_BLOCK for r in logs) >= 50  # of 60 such rows


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_csv_traces_read_burstgpt_and_azure_columns(tmp_path):
    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens\n5.5,llama,100,20\n5.0,llama,300,7\n")
    rows = read_trace(burst)
    assert [(r.at, r.input_tokens, r.output_tokens) for r in rows] == [(0.0, 300, 7), (0.5, 100, 20)]
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,4808,10\n"
                     "2023-11-16 18:15:50.1805900,3180,8\n")
    rows = read_trace(azure)
    assert rows[1].at == pytest.approx(3.5) and rows[0].input_tokens == 4808
    assert [r.index for r in share(read_trace(burst), 1, 2)] == [1]
    (tmp_path / "bad.csv").write_text("when,in\n1,2\n")
    with pytest.raises(UsageError, match="has no at column"):
        read_trace(tmp_path / "bad.csv")
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 1}\n')
    with pytest.raises(UsageError, match="line 1 is not a Mooncake row"):
        read_trace(tmp_path / "bad.jsonl")
