"""A swarm across hosts: the master and two workers in separate network namespaces (ip netns + veth + a
bridge) on this machine, talking over their own addresses. The rate splits over the hosts, custom options
reach the workers, and nothing is lost or counted twice."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from vllm_load.rundir.reqlog import read_log


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def hosts():
    """Namespaces m (10.77.K.1), a (.2) and b (.3) on a bridge in a hub namespace; removed afterwards."""
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root with iproute2: the multi-host test must run there")
        pytest.skip("needs root and iproute2 (ip netns)")
    k = random.randint(2, 250)
    tag = f"vlt{os.getpid() % 10000}"
    hub, names = f"{tag}hub", {"m": 1, "a": 2, "b": 3}
    created = []
    try:
        sh("ip", "netns", "add", hub)
        created.append(hub)
        sh("ip", "netns", "exec", hub, "ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "netns", "exec", hub, "ip", "link", "set", "br0", "up")
        for name, host in names.items():
            ns = f"{tag}{name}"
            sh("ip", "netns", "add", ns)
            created.append(ns)
            outer, inner = f"{tag}o{name}", f"{tag}i{name}"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", outer, "netns", hub)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "netns", "exec", hub, "ip", "link", "set", outer, "master", "br0")
            sh("ip", "netns", "exec", hub, "ip", "link", "set", outer, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.77.{k}.{host}/24", "dev", inner)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield {name: (f"{tag}{name}", f"10.77.{k}.{host}") for name, host in names.items()}
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def in_ns(ns: str, args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], env=env, cwd=ROOT, text=True, **kw)


def test_master_and_two_workers_on_separate_hosts(hosts, tmp_path):
    (m_ns, m_ip), (a_ns, _), (b_ns, _) = hosts["m"], hosts["a"], hosts["b"]
    emu = in_ns(m_ns, ["-m", "server.emulator", "--host", m_ip, "--port", "0", "--ttft", "0.01", "--itl", "0.002"],
                stdout=subprocess.PIPE)
    procs = [emu]
    try:
        url = emu.stdout.readline().split("listening on ", 1)[1].split()[0]
        assert url.startswith(f"http://{m_ip}:")
        run_dir = tmp_path / "run"
        master = in_ns(m_ns, ["-m", "locust", "-f", "locustfiles/chat.py", "--master", "--master-bind-host", m_ip,
                              "--master-bind-port", "5557", "--headless", "--expect-workers", "2", "-u", "4", "-r", "4",
                              "-t", "8s", "--host", url, "--request-rate", "24", "--input-tokens", "77",
                              "--output-tokens", "8", "--run-dir", str(run_dir)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(master)
        for ns in (a_ns, b_ns):
            procs.append(in_ns(ns, ["-m", "locust", "-f", "locustfiles/chat.py", "--worker", "--master-host", m_ip,
                                    "--master-port", "5557"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        out, err = master.communicate(timeout=120)
        assert master.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    logs = {f.name: read_log(f) for f in run_dir.glob("requests-*.jsonl")}
    assert len(logs) == 2 and all(rows for rows in logs.values())  # both hosts sent load
    everything = [r for rows in logs.values() for r in rows]
    # nothing lost, nothing counted twice
    assert summary["requests"] == len(everything) and summary["failed"] == 0
    assert summary["output_tokens"] == sum(r["output_tokens"] for r in everything)
    # the custom options reached the workers on the other hosts
    assert all(r["input_tokens"] == 77 and r["output_tokens"] == 8 for r in everything)
    # the rate was split over the hosts: the total is what was asked (Poisson, 8 s: within 30 %)
    assert 24 * 0.7 <= summary["send_rate"] <= 24 * 1.3, summary["send_rate"]
    shares = sorted(len(rows) for rows in logs.values())
    assert shares[0] >= 0.3 * sum(shares)  # each host carried its half, give or take chance
