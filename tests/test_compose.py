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
    assert set(compose["services"]) == {"vllm", "sidecar", "master", "worker"}
    worker = compose["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker  # --scale worker=N must work
    assert compose["services"]["vllm"]["image"].startswith("vllm/vllm-openai")
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
    check = ("import json, sys\nfrom locust.argument_parser import get_parser\nfrom vllm_load.plugin import options\n"
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
