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


def test_a_worker_without_its_own_key_stops_the_run_with_one_line_not_a_storm_of_401s(tmp_path, emulator_factory):
    """A remote worker started without its key sent 10,127 HTTP 401 in 8 s (the master passed the target's check
    with its own). The workers' first three answers are refusals: the run stops at once, in one line that says
    what to give the worker, exit 2."""
    emu = emulator_factory("--api-key", "the-key", "--ttft", "0.005", "--itl", "0.002")
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "--processes", "2", "-u", "2", "-r",
                          "2", "-t", "60s", "--host", emu.url, "--output-tokens", "4", "--api-key", "the-key",
                          "--run-dir", str(tmp_path / "run")], tmp_path)
    assert res.code == 2, res.stdout[-2000:] + res.stderr[-2000:]
    said = [x for x in res.stderr.splitlines() if x.startswith("vllm-load: error:")]
    assert len(said) == 1 and "refused the first 3 requests with HTTP 401" in said[0], res.stderr[-2000:]
    assert "this worker has no key: give it --api-key-file or VLLM_LOAD_API_KEY" in said[0]
    assert res.summary()["summary"]["failed"] < 100  # stopped at once, not after thousands


def test_a_body_the_server_never_takes_stops_the_run_after_twenty_refusals():
    """8,269 HTTP 400 in 8 s: the same 4xx twenty times in a row with nothing taken stops the run (exit 2); after a
    first success a refusal is measured, and 429 (an overloaded server) never stops it."""
    from vllm_load.client.record import RequestRecord
    from vllm_load.plugin.load.refusals import Refusals

    told: list = []

    def refused(status: int, ok: bool = False) -> RequestRecord:
        return RequestRecord(api="chat", start=0.0, e2e=0.01, ok=ok, status=status,
                             error=None if ok else f"HTTP {status}: {{'message': 'max_tokens must be at least 1'}}")

    watch = Refusals(lambda message, code: told.append((message, code)), worker=False, keyed=False)
    for _ in range(19):
        watch.add(refused(400))
    watch.add(refused(429))  # an overload between them counts for nothing
    assert told == []
    watch.add(refused(400))
    assert len(told) == 1 and told[0][1] == 2 and "refused the first 20 requests with HTTP 400" in told[0][0]
    assert "max_tokens must be at least 1" in told[0][0]
    after = Refusals(lambda message, code: told.append(message), worker=False, keyed=True)
    after.add(refused(200, ok=True))
    for _ in range(30):
        after.add(refused(401))
    assert len(told) == 1  # a server that refuses once it served is measured, not stopped
