"""--mlflow-uri and --wandb-project: a finished run logged to an experiment tracker by the real client libraries, read
back from what they stored (an MLflow file store; a W&B offline run's record log)."""

from __future__ import annotations

import json
import struct

import pytest

from tests.helpers import ROOT, run_in_process

mlflow = pytest.importorskip("mlflow", reason="the test extra installs mlflow-skinny")
wandb = pytest.importorskip("wandb", reason="the test extra installs wandb")


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One short run against the embedded emulator, logged to both trackers (a secret option set, to see it kept
    out): its run directory, the MLflow store's URI and the console."""
    tmp = tmp_path_factory.mktemp("trackers")
    store = (tmp / "mlruns").as_uri()
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-t", "3s", "--output-tokens",
                          "8", "--slo", "ttft.p99<=10s", "--mlflow-uri", store, "--mlflow-experiment", "gate",
                          "--wandb-project", "vllm-load-test", "--otlp-token", "s3cr3t-t0ken", "--run-dir",
                          str(tmp / "run")], cwd=tmp,
                         env_extra={"MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp / "run", store, res.stdout


def test_mlflow_holds_the_runs_options_numbers_verdict_and_report(logged, monkeypatch):
    run_dir, store, out = logged
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the store of this test; a user's is a server or database
    summary = json.loads((run_dir / "summary.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("gate").experiment_id])
    assert f"run logged to MLflow at {store} (experiment gate, run {run.info.run_id})" in out
    assert run.info.status == "FINISHED" and run.info.run_name == json.loads((run_dir / "config.json").read_text())["run_id"]
    s = summary["summary"]
    assert run.data.metrics["ttft_p50_ms"] == pytest.approx(s["metrics"]["ttft"]["p50"] * 1000)
    assert run.data.metrics["requests"] == s["requests"] > 0
    assert run.data.params["target"] == "emulator" and run.data.params["num_users"] == "2"
    assert run.data.tags["vllm_load.exit_code"] == "0" and run.data.tags["vllm_load.verdict"] == "pass"
    assert run.data.tags["vllm_load.target_kind"] == "emulator"
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.html", "summary.json", "vllm-result.json", "config.json"} <= files
    assert not any("s3cr3t-t0ken" in v for v in [*run.data.params.values(), *run.data.tags.values()])


def _wandb_records(path):
    """The protobuf records of a W&B offline run (LevelDB's log format: 32 KiB blocks, each record a 7-byte header
    of checksum, length and kind, FULL or FIRST..LAST fragments), after the file's 7-byte ``:W&B`` header."""
    from wandb.proto import wandb_internal_pb2

    data, pos, whole, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        whole += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(whole)
            out.append(record)
            whole = b""
    return out


def test_wandb_holds_the_runs_options_numbers_verdict_and_report(logged):
    run_dir, _, out = logged
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    records = _wandb_records(next(offline.glob("*.wandb")))
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert f"run logged to W&B (project vllm-load-test, run {run.run_id})" in out
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["target"] == "emulator" and config["num_users"] == "2"
    assert "vllm_load.verdict=pass" in run.tags and "vllm_load.exit_code=0" in run.tags
    summary = {u.key or u.nested_key[0]: json.loads(u.value_json) for r in records
               if r.WhichOneof("record_type") == "summary" for u in r.summary.update}
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["ttft_p50_ms"] == pytest.approx(s["metrics"]["ttft"]["p50"] * 1000)
    assert (offline / "files" / "report.html").exists() and (offline / "files" / "vllm-result.json").exists()
    assert b"s3cr3t-t0ken" not in b"".join(r.SerializeToString() for r in records)


def test_a_tracker_that_cannot_be_reached_is_said_and_the_run_keeps_its_exit_code(tmp_path):
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "2s", "--output-tokens",
                          "4", "--mlflow-uri", "http://127.0.0.1:9", "--run-dir", str(tmp_path / "run")], cwd=tmp_path,
                         env_extra={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if "not logged to MLflow" in x)
    assert line.startswith("vllm-load: the run was not logged to MLflow: ")
