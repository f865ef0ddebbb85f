"""--profile-at: the server's profiler (vLLM's POST /start_profile, /stop_profile) over one chosen load, against the
emulator's endpoints (served with --profiler-config, as vLLM's; each profile's window and the requests that arrived
in it are written where vLLM writes its traces). The real vLLM's profiler: tests/test_real_vllm.py."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log


def _sweep(tmp_path, url: str, *args: str):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", url, "--sweep", "1,3",
                          "--step-duration", "3", "--output-tokens", "8", "--run-dir", str(run_dir), *args], cwd=tmp_path,
                         timeout=120)
    return res, run_dir


def test_a_sweep_profiles_the_step_asked_and_only_it(tmp_path, emulator_factory):
    traces = tmp_path / "traces"
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005", "--profiler-config",
                           json.dumps({"profiler": "torch", "torch_profiler_dir": str(traces)}))
    res, run_dir = _sweep(tmp_path, emu.url, "--profile-at", "step:3")
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
    res, run_dir = _sweep(tmp_path, emu.url, "--profile-at", "step:1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert res.stdout.count("refused /start_profile (HTTP 404") == 1
    assert "profiled" not in json.loads((run_dir / "summary.json").read_text())["summary"]


def test_bad_profile_points_are_one_line(tmp_path):
    sweep, chat = str(ROOT / "locustfiles/sweep.py"), str(ROOT / "locustfiles/chat.py")
    for args, said in (([sweep, "--sweep", "1,3", "--profile-at", "step:2"], "the sweep has no step at 2 (its levels: 1, 3)"),
                       ([sweep, "--sweep", "1", "--profile-at", "soon"], "give N (the server's running requests"),
                       ([chat, "-t", "1s", "--profile-at", "step:4"], "step:LEVEL profiles a sweep's step"),
                       ([chat, "-t", "1s", "--profile-at", "run", "--profile-seconds", "0"], "--profile-seconds must be > 0"),
                       # no series to read the server's running requests from (nothing is sent to the host)
                       ([chat, "-t", "1s", "--host", "http://127.0.0.1:9", "--profile-at", "4"],
                        "--profile-at 4 starts on the server's running requests")):
        res = run_in_process(["-f", *args, "--headless", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
        assert res.returncode == 2 and said in res.stderr, (args, res.stderr[-1000:])


@pytest.mark.slow  # a server run up to its n-th request (11 s): the full suite's; the other --profile-at tests stay
def test_profile_at_n_starts_when_the_server_runs_n_requests(tmp_path, emulator_factory, sidecar_factory):
    """--profile-at 3: users added two a second; the profiler starts once the server's own series (its sidecar, 4 samples
    a second) says it runs 3 requests, and stops --profile-seconds later."""
    traces = tmp_path / "traces"
    emu = emulator_factory("--ttft", "0.05", "--itl", "0.02", "--profiler-config",
                           json.dumps({"profiler": "torch", "torch_profiler_dir": str(traces)}))
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "250ms", "--out", "")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "--host", emu.url, "-u", "6", "-r", "2",
                          "-t", "9s", "--output-tokens", "64", "--sidecar-url", side.url, "--profile-at", "3",
                          "--profile-seconds", "2", "--run-dir", str(run_dir)], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    (written,) = traces.glob("emulator-profile-*.json")
    profile = json.loads(written.read_text())
    assert profile["requests"] > 0 and 1.5 < profile["stop"] - profile["start"] < 3.5, profile
    window, = json.loads((run_dir / "summary.json").read_text())["summary"]["profiled"]
    assert window["what"] == "the server at 3+ running requests", window
    # the server ran 3 or more requests in its last sample before the profile started (on the client's clock)
    series = [json.loads(x) for x in (run_dir / "server.jsonl").read_text().splitlines()]
    before = [s for s in series if s["t"] <= profile["start"]]
    assert before and before[-1]["running"] >= 3, before[-3:]
    first = next(s for s in series if s["running"] >= 3)  # and started within the live poll's lag of it (2 s + 0.5 s)
    assert profile["start"] - first["t"] < 4.0, (first, profile)


def test_the_web_uis_form_refuses_a_profile_point_as_the_command_line_does(tmp_path, emulator_factory):
    """The start form is judged as the command line is: --profile-at N with no series to read (a --host with no
    sidecar), or a sweep step outside a sweep, is refused where it was given, in one line; --repeat shapes the run at
    start-up, so the form has no field for it; an empty Host is refused as a dead one is."""
    from tests.helpers import UIHere
    from tests.test_security import _form, request

    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")
    ui = UIHere(tmp_path, "--host", emu.url)
    try:
        for form, said in ((_form(profile_at="4"), "--profile-at 4 starts on the server's running requests"),
                           (_form(profile_at="step:2"), "step:LEVEL profiles a sweep's step"),
                           (_form(profile_seconds="0"), "--profile-seconds must be > 0"),
                           (_form(repeat="3"), "the form has no field 'repeat'"),
                           # values the command line refuses: they answered "Swarming started" and sat at 0 requests
                           (_form(input_tokens="-5"), "--input-tokens"),
                           (_form(output_tokens="0"), "--output-tokens"),
                           (_form(extra_body="{bad"), "--extra-body"),
                           (_form(cancel="rate=2,after=4tok"), "--cancel 'rate=2,after=4tok': rate must be a share"),
                           (_form(model="base:0,lora-a:1"), "a model's weight must be a number above 0"),
                           # an emptied Host: it printed IndexError and StopTest, and the badge kept its old target
                           (_form(host=" "), f"Host is empty: give the server's URL, e.g. http://127.0.0.1:8000 "
                                             f"(it was {emu.url})")):
            status, _h, body = request(ui.base + "/swarm", form, {"Origin": ui.base})
            answer = json.loads(body)
            assert status == 200 and answer["success"] is False and said in answer["message"], (form, body)
        assert ui.state() == "ready"  # nothing started
    finally:
        ui.close()
