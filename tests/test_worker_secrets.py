"""A master sends its workers no secret: Locust copies the master's parsed options into every spawn message, in clear,
to whatever joined its port; the plugin leaves the secret options and credential headers out, and each worker uses
its own (a master and two workers in the test's process, over Locust's own ZMQ)."""

from __future__ import annotations

from tests.helpers import ROOT, run_in_process


def test_a_masters_spawn_messages_carry_no_secret_and_each_worker_uses_its_own(tmp_path, emulator_factory):
    emu = emulator_factory("--api-key", "the-key", "--ttft", "0.005", "--itl", "0.002")
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "--processes", "2", "-u", "2", "-r",
                          "2", "-t", "60s", "--num-requests", "6", "--host", emu.url, "--output-tokens", "4",
                          "--api-key", "the-key", "--sidecar-token", "master-only-token",
                          "--header", "X-Api-Key: master-header", "--header", "X-Team: both",
                          "--run-dir", str(tmp_path / "run")], tmp_path,
                         worker_args=["--api-key", "the-key", "--header", "X-Api-Key: worker-header"])
    assert res.code == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert len(res.workers) == 2
    for worker in res.workers:
        opts = worker.opts  # what the worker has after the master's spawn messages updated its options
        assert opts.api_key == "the-key" and opts.sidecar_token == ""  # its own key; the master's token never came
        assert "X-Api-Key: master-header" not in opts.header and "X-Api-Key: worker-header" in opts.header
        assert "X-Team: both" in opts.header  # the master's other headers do come
    assert res.summary()["summary"]["succeeded"] == 6  # every request carried a key the server took
