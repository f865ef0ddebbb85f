"""Several targets in one run (--host a,b): replicas of one model, users spread over them round robin across the
swarm's processes, per-target rows beside the totals, and a replica that goes down named as that target's outage
while the other keeps the run going. Two emulators on 127.0.0.1, Locust's own master and workers (--processes), all
in the test's process (``run_in_process``)."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter

import gevent
import pytest

from tests.helpers import ROOT, run_in_process, wait_for
from vllm_load.rundir.reqlog import read_log


def _served(url: str) -> int:
    """The emulator's own count of the requests it finished (vLLM's vllm:request_success counter)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return int(sum(s.value for f in text_string_to_metric_families(text) if f.name == "vllm:request_success"
                   for s in f.samples if s.name.endswith("_total")))


def _logs(run_dir) -> list[dict]:
    return [r for p in sorted(run_dir.glob("requests*.jsonl")) for r in read_log(p)]


def test_two_replicas_share_a_swarms_users_and_each_has_its_rows(tmp_path, emulator_factory, sidecar_factory):
    a, b = (emulator_factory("--ttft", "0.02", "--itl", "0.005").url for _ in range(2))
    sidecars = [sidecar_factory("--vllm-url", url, "--interval", "500ms", "--out", str(tmp_path / f"side{k}.jsonl")).url
                for k, url in enumerate((a, b))]
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "--processes", "2", "-u", "4", "-r", "4",
                          "-t", "6s", "--host", f"{a},{b}", "--sidecar-url", ",".join(sidecars), "--output-tokens", "8",
                          "--run-dir", str(run_dir)], cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    targets = summary["targets"]
    assert sorted(targets) == sorted([a, b])
    # each replica got half the users (2 of 4, over 2 processes), so about half the requests
    logs = _logs(run_dir)
    by_target = Counter(r["target"] for r in logs if not r.get("warmup"))
    assert by_target[a] and by_target[b] and 0.7 < by_target[a] / by_target[b] < 1.4, by_target
    assert len({r["worker"] for r in logs if r["target"] == a}) == 2  # both processes sent to each replica
    # exact: each target's rows equal its requests in the workers' logs and the replica's own counter
    for url in (a, b):
        assert targets[url]["requests"] == by_target[url] == _served(url), (url, targets[url]["requests"])
    assert summary["requests"] == sum(t["requests"] for t in targets.values()) == _served(a) + _served(b)
    assert "by target (--host)" in res.stdout and f"{a} " in res.stdout
    # one sidecar per replica, merged on the client's clock into the fleet's series: its counters end at the sum
    # of both replicas' (the sidecars scrape every 0.5 s; the window ends 2 s after the run)
    series = [json.loads(line) for line in (run_dir / "server.jsonl").read_text().splitlines()]
    last = series[-1]
    assert sum(last["request_success_total"].values()) == _served(a) + _served(b) == summary["requests"]
    assert last["prompt_tokens_total"] == summary["input_tokens"]
    assert max(s["running"] for s in series) <= 4  # the fleet's running: both replicas' summed, at most the users
    assert all(x["t"] <= y["t"] for x, y in zip(series, series[1:]))
    assert "id='by-target'" in (run_dir / "report.html").read_text()


@pytest.mark.slow  # a replica process stopped mid-run (9.5 s): the full suite's
def test_a_replica_that_goes_down_is_that_targets_outage_only(tmp_path, emulator_factory):
    a, b = emulator_factory("--ttft", "0.02", "--itl", "0.005"), emulator_factory("--ttft", "0.02", "--itl", "0.005")
    run_dir = tmp_path / "run"

    def take_b_down() -> None:  # beside the run, on the same loop: replica B goes away for the rest of the run
        wait_for(lambda: _served(b.url) >= 10, timeout=60, what="replica B serving the run", poll=0.2)
        b.stop()

    down = gevent.spawn(take_b_down)
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "9s",
                          "--host", f"{a.url},{b.url}", "--output-tokens", "8", "--outage-after", "1s",
                          "--retry-backoff-max", "0.2s", "--run-dir", str(run_dir)], cwd=tmp_path, timeout=120)
    down.get(timeout=1)  # it went down during the run
    out = res.stdout
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    outages = summary["outages"]
    assert [w["target"] for w in outages if w["outage"]] == [b.url], outages
    assert outages[0]["text"].startswith(f"target {b.url}: server unreachable from ")
    assert summary["outage_seconds"] == 0.0  # the run itself never lost its target: replica A answered throughout
    assert summary["targets"][a.url]["failed"] == 0 and summary["targets"][b.url]["failed"] > 0
    assert f"OUTAGE: target {b.url}: server unreachable since" in out, out[-3000:]
    assert res.returncode == 1, out[-3000:]  # requests failed (Locust's exit code for that), nothing worse


def test_replicas_must_serve_one_model(tmp_path, emulator_factory):
    a = emulator_factory("--model", "one/model", "--tokenizer", "builtin:mistral-7b-v0.1").url
    b = emulator_factory("--model", "another/model", "--tokenizer", "builtin:mistral-7b-v0.1").url
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "2s",
                          "--host", f"{a},{b}", "--tokenizer", "builtin:mistral-7b-v0.1", "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("vllm-load: error:")]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-2000:]
    assert f"--host {b} serves 'another/model', not 'one/model'" in errors[0]
