"""Dataset readers on small files made here, and dataset prompts end to end."""

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.workload.inputs.datasets import BATCH_INSTRUCTION, DatasetSource, answer_tokens_per_record, read_records
from vllm_load.errors import UsageError
from vllm_load.workload.prompts import PromptFactory
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, load_tokenizer


@pytest.fixture
def files(tmp_path):
    share = tmp_path / "sharegpt.json"
    share.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "What is a KV cache?"},
                                      {"from": "gpt", "value": "It stores keys and values of past tokens."}]},
        {"id": "b", "conversations": [{"from": "human", "value": "Only one turn"}]},  # skipped: no reply
        {"id": "c", "conversations": [{"from": "human", "value": "Explain batching."},
                                      {"from": "gpt", "value": "Many requests share one forward pass."}]},
    ]))
    jl = tmp_path / "texts.jsonl"
    jl.write_text('{"text": "first record"}\n\n{"body": "no text field"}\n{"text": "second record"}\n')
    cs = tmp_path / "reviews.csv"
    cs.write_text('id,review,label\n1,"Great phone, fast",pos\n2,"Broke after a day",neg\n3,,neg\n')
    return share, jl, cs


def test_readers(files):
    share, jl, cs = files
    s = read_records(share)
    assert [r.text for r in s] == ["What is a KV cache?", "Explain batching."]
    assert s[0].answer.startswith("It stores")
    assert [r.text for r in read_records(jl)] == ["first record", "second record"]
    assert [r.text for r in read_records(cs, field="review")] == ["Great phone, fast", "Broke after a day"]
    assert [r.text for r in read_records(jl, field="body")] == ["no text field"]


@pytest.mark.parametrize("make, match", [
    (lambda d: (d / "missing.json", "", ""), "cannot be read"),
    (lambda d: ((d / "bad.json").write_text("{oops") and d / "bad.json", "", ""), "is not JSON"),
    (lambda d: ((d / "x.csv").write_text("a,b\n1,2\n") and d / "x.csv", "", "review"), "has no column 'review'"),
    (lambda d: ((d / "e.jsonl").write_text('{"x": 1}\n') and d / "e.jsonl", "", ""), "no usable"),
    (lambda d: (d / "e.jsonl", "parquet", ""), "is unknown"),
])
def test_bad_datasets_are_one_line_errors(tmp_path, make, match):
    path, fmt, field = make(tmp_path)
    with pytest.raises(UsageError, match=match):
        read_records(path, fmt, field)


def test_batch_mode_joins_k_records_under_one_instruction_whatever_k(files):
    _, _, cs = files
    src = DatasetSource(read_records(cs, field="review"), seed="s", batch=3)
    content, answer = src.next_content()
    assert answer is None
    assert content.startswith(BATCH_INSTRUCTION + "\n")
    assert content.count("\n") == 3 and "\n1. " in content and "\n3. " in content
    one, _ = DatasetSource(read_records(cs, field="review"), seed="s", batch=1).next_content()
    assert one.split("\n")[0] == content.split("\n")[0] == BATCH_INSTRUCTION and one.count("\n") == 1
    # no batching: the record as it is
    plain, _ = DatasetSource(read_records(cs, field="review"), seed="s").next_content()
    assert plain in ("Great phone, fast", "Broke after a day")


def test_the_answer_budget_covers_every_answer_line_the_instruction_asks_for():
    tok = load_tokenizer(BUILTIN_MISTRAL)
    for k in (1, 8, 12):
        per = answer_tokens_per_record(tok, k)
        lines = "".join(f"{i}. {label}\n" for i in range(1, k + 1) for label in ("negative",))
        assert per * k >= len(tok.encode(lines, add_special_tokens=False)), k


def test_dataset_prompts_are_unique_even_when_records_repeat(files):
    share, _, _ = files
    tok = load_tokenizer(BUILTIN_MISTRAL)
    f = PromptFactory(tok, "chat", salt="ds")
    src = DatasetSource(read_records(share), seed="s")
    prompts = [f.wrap(src.next_content()[0]) for _ in range(6)]  # 2 records, each replayed 3 times
    contents = [p.messages[0]["content"] for p in prompts]
    assert len(set(contents)) == 6
    assert len({c.split()[0] for c in contents}) == 6  # differ from the very first word
    # the digest words stand on a line of their own, apart from the record
    assert all(c.split("\n", 1)[1] in ("What is a KV cache?", "Explain batching.") for c in contents)
    assert all(p.tokens == tok.count_chat(p.messages) for p in prompts)


def test_csv_batch_run_end_to_end(files, tmp_path):
    _, _, cs = files
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "3s",
                          "--dataset", str(cs), "--dataset-field", "review", "--dataset-batch", "2",
                          "--align-with-server", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--align-with-server: a 100-token chat prompt by tokenizer" in res.stdout and "prompt lengths match" in res.stdout
    logs = read_log(run_dir / "requests.jsonl")
    per = answer_tokens_per_record(load_tokenizer(BUILTIN_MISTRAL), 2)
    assert logs and all(r["output_tokens"] == 2 * per and r["input_tokens"] == r["input_tokens_asked"] for r in logs)


def test_align_with_server_catches_a_wrong_tokenizer(tmp_path, emulator_factory):
    from tests.tokenizers_fixture import build_byte_level_bpe

    emu = emulator_factory()
    bpe = build_byte_level_bpe(tmp_path / "bpe")
    res = run_in_process(["-f", str(ROOT / "locustfiles/completions.py"), "--headless", "-u", "1", "-t", "2s",
                          "--host", emu.url, "--tokenizer", str(bpe), "--align-with-server",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 2
    assert "pass --tokenizer with the server's own tokenizer" in res.stderr


def test_hugging_face_datasets_saved_locally_parquet_and_conversations(tmp_path):
    import datasets

    from vllm_load.errors import UsageError
    from vllm_load.workload.inputs.datasets import read_records

    texts = [f"review number {i}: the kv cache held" for i in range(5)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts, "label": list(range(5))}),
                          "test": datasets.Dataset.from_dict({"text": ["only in test"], "label": [0]})}
                         ).save_to_disk(str(tmp_path / "saved"))
    assert [r.text for r in read_records(f"hf:{tmp_path / 'saved'}")] == texts
    assert [r.text for r in read_records(f"hf:{tmp_path / 'saved'}:test")] == ["only in test"]
    datasets.Dataset.from_dict({"body": texts}).to_parquet(str(tmp_path / "data.parquet"))
    assert [r.text for r in read_records(f"hf:{tmp_path / 'data.parquet'}", field="body")] == texts
    convs = [[{"from": "human", "value": "first"}, {"from": "gpt", "value": "x"}, {"from": "human", "value": "second"}]]
    datasets.Dataset.from_dict({"conversations": convs}).save_to_disk(str(tmp_path / "convs"))
    (rec,) = read_records(f"hf:{tmp_path / 'convs'}")
    assert rec.user_turns == ("first", "second")
    with pytest.raises(UsageError, match="has no split 'validation'"):
        read_records(f"hf:{tmp_path / 'saved'}:validation")
    with pytest.raises(UsageError, match="has no column 'nope'"):
        read_records(f"hf:{tmp_path / 'saved'}", field="nope")
    with pytest.raises(UsageError, match="cannot be loaded"):
        read_records(f"hf:{tmp_path / 'missing'}")


def test_a_run_sends_the_records_of_a_local_hugging_face_dataset(tmp_path, emulator_factory):
    import datasets

    texts = [f"distinctive record {i} about batching" for i in range(6)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"))
    sent = tmp_path / "sent.jsonl"
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--request-log", str(sent))
    # ended by its count (2 s beside six busy workers once sent 1)
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "60s", "--num-requests",
                          "6", "--host", emu.url, "--dataset", f"hf:{tmp_path / 'saved'}", "--output-tokens", "4",
                          "--run-dir", str(tmp_path / "run")],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    contents = [json.loads(line)["body"]["messages"][-1]["content"] for line in sent.read_text().splitlines()]
    assert len(contents) >= 6 and {c.split("\n", 1)[1] for c in contents} == set(texts)


def test_a_hub_dataset_without_the_hub_is_one_line_at_once(tmp_path):
    """hf:NAME where the Hub cannot be reached (HF_ENDPOINT on a closed port): the local cache only, and one line
    saying what to do, in seconds (the Hub client retried for 25 s before its error)."""
    import socket
    import time

    pytest.importorskip("datasets")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    t0 = time.monotonic()
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "2s",
                          "--dataset", "hf:someone/not-cached", "--run-dir", str(tmp_path / "run")], cwd=tmp_path,
                         env_extra={"HF_ENDPOINT": f"http://127.0.0.1:{closed}", "HF_HOME": str(tmp_path / "hf")})
    took = time.monotonic() - t0
    errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-2000:]
    assert "is not reachable from here and the dataset is not in the local cache" in errors[0]
    assert "Retrying" not in res.stderr and took < 20, took
