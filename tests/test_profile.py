"""--profile-at: the server's profiler (vLLM's POST /start_profile, /stop_profile) over one chosen load, against the
emulator's endpoints (served with --profiler-config, as vLLM's; each profile's window and the requests that arrived
in it are written where vLLM writes its traces). The real vLLM's profiler: tests/test_real_vllm.py."""

from __future__ import annotations

import json

from tests.helpers import ROOT, run_locust
from vllm_load.rundir.reqlog import read_log


def _sweep(tmp_path, url: str, *args: str):
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", url, "--sweep", "1,3",
                      "--step-duration", "3", "--output-tokens", "8", "--run-dir", str(run_dir), *args], cwd=tmp_path,
                     timeout=120)
    return res, run_dir


def test_a_sweep_profiles_the_step_asked_and_only_it(tmp_path, emulator_factory):
    traces = tmp_path / "traces"
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005", "--profiler-config",
                           json.dumps({"profiler": "torch", "torch_profiler_dir": str(traces)}))
    res, run_dir = _sweep(tmp_path, emu.url, "--profile-at", "3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "profiler started on 1 target(s) at sweep step 1 (3 users)" in res.stdout
    (written,) = traces.glob("emulator-profile-*.json")  # one profile: the step at 3 users
    profile = json.loads(written.read_text())
    # the requests that reached the server while it profiled are the profiled step's: the client's log says which
    # step each request belonged to (a request in flight at a step's change is the one allowed at either edge)
    logs = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f)]
    inside = [r for r in logs if profile["start"] <= r["start"] <= profile["stop"]]
    assert profile["requests"] > 0 and abs(len(inside) - profile["requests"]) <= 3, (len(inside), profile)
    assert sum(r["step"] != 1 for r in inside) <= 3, [r["step"] for r in inside]
    window, = json.loads((run_dir / "summary.json").read_text())["summary"]["profiled"]
    assert window["what"] == "sweep step 1 (3 users)" and 2.5 < window["to_s"] - window["from_s"] < 4.5, window
    assert "profiled: sweep step 1 (3 users)" in res.stdout


def test_a_server_without_a_profiler_is_said_once_and_the_run_goes_on(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")  # no --profiler-config: 404, as vLLM's
    res, run_dir = _sweep(tmp_path, emu.url, "--profile-at", "1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert res.stdout.count("refused /start_profile (HTTP 404") == 1
    assert "profiled" not in json.loads((run_dir / "summary.json").read_text())["summary"]


def test_a_level_the_sweep_does_not_have_is_one_line(tmp_path):
    for args, said in ((["--sweep", "1,3", "--profile-at", "2"], "the sweep has no step at 2 (its levels: 1, 3)"),
                       (["--sweep", "1", "--profile-at", "soon"], "give 'run' (the measured window)")):
        res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", *args, "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path, timeout=60)
        assert res.returncode == 2 and said in res.stderr, res.stderr[-1000:]
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-t", "1s", "--profile-at", "4",
                      "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "or, with --sweep, one of its levels" in res.stderr, res.stderr[-1000:]
