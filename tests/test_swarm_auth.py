"""An authenticated swarm (``plugin/swarm/swarm_auth.py``): no process on the master's port without the token changes a
number, a verdict or the exit code, and the master names it. The forged messages are the ones a hostile local
process sent: another run's LLM stats in a ``stats`` report, and a fatal message whose ``code: 0`` became the exit
code."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.helpers import ROOT, free_port, wait_for
from tests.test_process_faults import locust, logs
from vllm_load.plugin.swarm import swarm_auth

FORGER = r"""
import sys, time, zmq
from locust.rpc.protocol import Message
port, mark = int(sys.argv[1]), sys.argv[2]
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.IDENTITY, b"forger_1")
s.setsockopt(zmq.LINGER, 0)
s.connect(f"tcp://127.0.0.1:{port}")
s.send(Message("client_ready", "2.47.0", "forger_1").serialize())
forged = {"vllm_load": {"requests": 4225, "succeeded": 4225}, "stats": [], "stats_total": {}, "errors": {},
          "user_count": 0, "user_classes_count": {}}
s.send(Message("stats", forged, "forger_1").serialize())
s.send(Message("vllm_load_fatal", {"message": "\x1b[31mforged stop\x1b[0m", "code": 0}, "forger_1").serialize())
open(mark, "w").write("sent\n")
time.sleep(1.0)  # its sockets' reconnects: the master's refusals to see (this is the forger's own pace)
"""


@pytest.fixture
def keys(monkeypatch):
    """The module's keys, restored after the test (they are per process)."""
    monkeypatch.setattr(swarm_auth, "KEYS", swarm_auth._Keys())
    return swarm_auth.KEYS


def test_a_token_file_keys_the_master_and_workers_alike_and_a_bad_one_is_one_line(tmp_path, keys, capsys):
    token = tmp_path / "token"
    token.write_text("s3cret-swarm-token\n")
    swarm_auth.settle(Namespace(swarm_token_file=str(token)))
    first = keys.server_public
    swarm_auth.settle(Namespace(swarm_token_file=str(token)))
    assert keys.server_public == first and keys.server_secret != first and swarm_auth.authenticated()
    token.write_text("another")
    swarm_auth.settle(Namespace(swarm_token_file=str(token)))
    assert keys.server_public != first
    swarm_auth.settle(Namespace(swarm_token_file=""))  # no token, not a --processes master: Locust's plain sockets
    assert not swarm_auth.authenticated() and "takes any process" in swarm_auth.open_line(5557)
    swarm_auth.settle(Namespace(swarm_token_file="", workers_of_this_master=True))
    assert swarm_auth.authenticated() and "--processes" in swarm_auth.open_line(5557)
    for content, said in ((b"", "it is empty"), (b"x" * 5000, "not a token")):
        token.write_bytes(content)
        with pytest.raises(SystemExit) as exc:
            swarm_auth.settle(Namespace(swarm_token_file=str(token)))
        assert exc.value.code == 2 and said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        swarm_auth.settle(Namespace(swarm_token_file=str(tmp_path / "missing")))
    assert "cannot read it" in capsys.readouterr().err


def test_locusts_sockets_talk_with_the_token_and_refuse_a_peer_without_it(tmp_path, keys):
    """Locust's own rpc classes, as its runners make them: a worker's message with the token arrives; a plain
    ZeroMQ peer's handshake fails and nothing of it arrives."""
    from locust.rpc import Message, zmqrpc

    token = tmp_path / "token"
    token.write_text("s3cret-swarm-token")
    swarm_auth.settle(Namespace(swarm_token_file=str(token)))
    port = free_port()
    server = zmqrpc.Server("127.0.0.1", port)
    monitor = server.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                               | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    client = zmqrpc.Client("127.0.0.1", port, "worker_1")
    plain = zmq.Context.instance().socket(zmq.DEALER)
    try:
        client.send(Message("hello", {"n": 1}, "worker_1"))
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        addr, msg = server.recv_from_client()
        assert (addr, msg.type, msg.data) == ("worker_1", "hello", {"n": 1})
        plain.setsockopt(zmq.LINGER, 0)
        plain.setsockopt(zmq.IDENTITY, b"forger_1")
        plain.connect(f"tcp://127.0.0.1:{port}")
        plain.send(Message("stats", {"vllm_load": {"requests": 4225}}, "forger_1").serialize())
        assert recv_monitor_message(monitor)["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED  # refused at the handshake
        assert server.socket.poll(0) == 0  # nothing of it reached the master
    finally:
        plain.close()
        client.close(linger=0)
        server.close(linger=0)


@pytest.mark.slow
def test_a_local_process_on_a_processes_masters_port_cannot_change_the_run(tmp_path):
    """--processes 2 makes its own token: a forger's stats and its fatal ``code: 0`` never reach the run; the summary
    equals the request logs, the exit code is the verdict's, and the master names the refusals."""
    run_dir, port, mark = tmp_path / "run", free_port(), tmp_path / "sent"
    (tmp_path / "forge.py").write_text(FORGER)
    p = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "8s",
                "--processes", "2", "--master-bind-port", str(port), "--output-tokens", "16", "--run-dir",
                str(run_dir), "--allow-untrustworthy"], tmp_path)
    try:
        wait_for(lambda: len(logs(run_dir)) >= 4, timeout=120, what="the swarm's first requests")
        forger = subprocess.run([sys.executable, str(tmp_path / "forge.py"), str(port), str(mark)], timeout=60,
                                capture_output=True, text=True)
        assert forger.returncode == 0 and mark.exists(), forger.stderr[-2000:]
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    data = json.loads((run_dir / "summary.json").read_text())
    assert data["summary"]["requests"] == len(logs(run_dir)) < 4225  # the forged stats merged nothing
    assert p.returncode == data["exit_code"] == 0, out[-3000:] + err[-3000:]  # not stopped by the forged fatal
    assert "refused 127.0.0.1:" in out or "refused a peer" in out
    assert "forged stop" not in out + err and "\x1b[31m" not in out + err
    assert "takes only workers that hold the swarm token" in out


@pytest.mark.slow
def test_a_remote_worker_with_the_token_joins_and_one_with_another_token_does_not(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("the-swarm-token-1")
    bad.write_text("not-the-swarm-token")
    run_dir, port = tmp_path / "run", free_port()
    master = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--master", "--master-bind-port", str(port),
                     "--headless", "--expect-workers", "1", "-u", "2", "-r", "2", "-t", "6s", "--host", emu.url,
                     "--output-tokens", "16", "--run-dir", str(run_dir), "--swarm-token-file", str(good),
                     "--allow-untrustworthy"], tmp_path)
    worker_args = ["-f", str(ROOT / "locustfiles/chat.py"), "--worker", "--master-port", str(port)]
    intruder = locust([*worker_args, "--swarm-token-file", str(bad)], tmp_path)
    worker = None
    try:  # the intruder tries from before the run to its end (ZeroMQ reconnects): refused all along
        worker = locust([*worker_args, "--swarm-token-file", str(good)], tmp_path)
        out, err = master.communicate(timeout=120)
    finally:
        for p in (master, intruder, worker):
            if p is not None and p.poll() is None:
                p.kill()
    data = json.loads((run_dir / "summary.json").read_text())
    assert master.returncode == data["exit_code"] == 0, out[-3000:] + err[-3000:]
    assert data["summary"]["requests"] == len(logs(run_dir)) > 0
    assert len(data["summary"]["workers"]) == 1  # the intruder never joined
    assert "refused 127.0.0.1:" in out or "refused a peer" in out
