"""docker-compose.yml parses, and every service runs one of the project's real entry points."""

import importlib
import json
import re
import subprocess
import sys

import yaml

from tests.helpers import ROOT


def load():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_scalable_workers():
    compose = load()
    core = {n for n, svc in compose["services"].items() if "profiles" not in svc}
    assert core == {"vllm", "sidecar", "master", "worker"}
    worker = compose["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker  # --scale worker=N must work
    assert compose["services"]["vllm"]["image"].startswith("vllm/vllm-openai:v")
    # every image pinned to a version; the default model is one that needs no gated-model token
    images = [svc["image"] for svc in compose["services"].values() if "image" in svc]  # the rest: built here
    assert len(images) == 3 and not [i for i in images if i.endswith(":latest") or ":" not in i], images
    assert "${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}" in compose["services"]["vllm"]["command"]
    assert any("./reports:" in v for v in compose["services"]["master"]["volumes"])


def help_text(argv):
    return subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120).stdout


def test_commands_are_real_entry_points_with_real_options():
    services = load()["services"]
    side = services["sidecar"]["command"]
    assert side[:3] == ["python", "-m", "server.sidecar"]
    importlib.import_module("server.sidecar.app")
    side_help = help_text(["-m", "server.sidecar"])
    for flag in (a for a in side if a.startswith("--")):
        assert flag in side_help, flag
    for name in ("master", "worker"):
        cmd = services[name]["command"]
        assert cmd[0] == "locust" and cmd[1] == "-f" and (ROOT / cmd[2]).is_file()
    # Locust's own parser with vllm-load's options (in a child: importing locust monkey-patches the process);
    # an unknown flag makes it exit with an error
    check = ("import json, sys\nfrom locust.argument_parser import get_parser\nfrom vllm_load import options\n"
             "p = get_parser(); options.add_arguments(p)\n"
             "a = p.parse_args(json.loads(sys.argv[1]))\n"
             "print(json.dumps({'locustfile': a.locustfile, 'worker': a.worker, 'master_host': a.master_host}))")
    for name in ("master", "worker"):
        argv = [re.sub(r"\$\{[A-Z_]+:-(.*)\}", r"\1", a) for a in services[name]["command"][1:]]
        res = subprocess.run([sys.executable, "-c", check, json.dumps(argv)], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        parsed = json.loads(res.stdout.strip().splitlines()[-1])
        assert parsed["locustfile"] == "locustfiles/chat.py"
        assert parsed["worker"] == (name == "worker") and (name == "master" or parsed["master_host"] == "master")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY vllm_load" in dockerfile and "COPY server" in dockerfile and "pip install" in dockerfile
    # the native reader is built (setup.py, a compiler) and the build is checked
    assert "COPY setup.py" in dockerfile and "gcc" in dockerfile and "vllm-load native" in dockerfile


def test_the_stack_waits_for_vllm_to_be_healthy():
    services = load()["services"]
    check = services["vllm"]["healthcheck"]
    assert "/health" in " ".join(check["test"]) and check["test"][0] == "CMD"
    # failures while the model loads do not count: a first start downloads and loads the weights for minutes
    start_period = check["start_period"]
    assert start_period.endswith("m") and int(start_period[:-1]) >= 15
    for name in ("sidecar", "master"):
        assert services[name]["depends_on"]["vllm"]["condition"] == "service_healthy", name
        cmd = services[name]["command"]
        assert cmd[cmd.index("--wait-for-server") + 1] == "30m", name  # a second guard, e.g. outside compose
    assert services["worker"]["depends_on"] == ["master"]


def test_the_observability_profile_scrapes_both_sides_and_ships_a_dashboard_of_both():
    from vllm_load.metrics.fleet.prometheus import EXPORTED

    services = load()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["observability"]
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])  # not beyond the host by default
        for volume in services[name]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in scrape["scrape_configs"] for cfg in job["static_configs"] for t in cfg["targets"]}
    assert targets == {"vllm:8000", "master:8089"}  # vLLM's /metrics and the master's (web UI port)
    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "vllm-load.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    exported = {name for _, name, _, _ in EXPORTED}
    for client, server in (("vllm_load:time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
                           ("vllm_load:inter_token_latency_seconds", "vllm:inter_token_latency_seconds")):
        assert client in exported and client in exprs and server in exprs
