"""A server that is not vLLM: told by /v1/models (owned_by) or --server-kind, it is sent standard OpenAI fields
only, and every request succeeds where vLLM's fields would be refused (the emulator acting as a strict
OpenAI-compatible server: another owned_by, and 400 for vLLM's fields)."""

from __future__ import annotations

import json

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.files import load_run
from vllm_load.rundir.reqlog import read_log

VLLM_FIELDS = "ignore_eos,min_tokens,continuous_usage_stats"


def test_a_server_that_is_not_vllm_gets_standard_fields_only(tmp_path, emulator_factory):
    bodies = tmp_path / "bodies.jsonl"
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.003", "--owned-by", "llamacpp", "--reject", VLLM_FIELDS,
                           "--request-log", str(bodies))
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "2s",
                          "--host", emu.url, "--output-tokens", "12", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "the server is not vLLM (/v1/models owned_by 'llamacpp'" in res.stdout
    logs = read_log(run_dir / "requests.jsonl")
    assert logs and all(r["ok"] and r["tokens_from_usage"] and not r["continuous_usage"] for r in logs)
    sent = [json.loads(line)["body"] for line in bodies.read_text().splitlines()]
    assert sent and not any(k in b or k in b.get("stream_options", {}) for b in sent for k in VLLM_FIELDS.split(","))
    assert all(b["max_tokens"] == 12 and b["stream_options"] == {"include_usage": True} for b in sent)
    config = json.loads((run_dir / "config.json").read_text())
    assert load_run(run_dir).plan.server_kind == "openai"  # the run plan, read back from config.json
    assert config["target_kind"] == "OpenAI-compatible server (owned_by 'llamacpp')"


def test_server_kind_vllm_overrides_the_detection(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.003", "--owned-by", "llamacpp", "--reject", "min_tokens")
    run_dir = tmp_path / "run"
    # ended by its count (2 s beside six busy workers once sent none)
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
                          "--num-requests", "3", "--host", emu.url, "--output-tokens", "4", "--server-kind", "vllm",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    logs = read_log(run_dir / "requests.jsonl")
    # told it is vLLM, the client sends min_tokens, which this server refuses
    assert logs and all(not r["ok"] and "min_tokens" in r["error"] for r in logs) and res.returncode != 0


def test_a_standalone_emulator_is_named_as_the_emulator_not_as_vllm(emulator_factory):
    """A standalone emulator was reported as "vLLM 0.32.0" on the console and in the report."""
    from argparse import Namespace

    from vllm_load.client.apis.openai_api import server_identity
    from vllm_load.plugin.prepare.target import Target

    emu = emulator_factory("--ttft", "0.005", "--itl", "0.001")
    version, emulated = server_identity(emu.url)
    assert version and emulated
    target = Target(emu.url, "m", "t", 0, False, Namespace(), Namespace(), 1.0, server_version=version,
                    emulated=True)
    assert target.kind == f"EMULATOR (standalone, of vLLM {version})"
    embedded = Target(emu.url, "m", "t", 0, True, Namespace(), Namespace(), 1.0, server_version=version)
    assert embedded.kind == f"EMULATOR (of vLLM {version})"
