"""The Kubernetes manifests (deploy/kubernetes/: a Kustomize base and two overlays, a CI gate and the interactive web
UI), each overlay rendered offline with `kubectl kustomize` (the machine image's kubectl 1.32, Kustomize 5.5): valid
against Kubernetes' own schemas (kubernetes-validate), and consistent: workers join the Service the master's port
is behind, the web UI is not published, every option and flag they give is one the image understands, and the
secret comes from a Secret."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time

import kubernetes_validate
import pytest
import yaml

from tests.helpers import ROOT

K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("ci-gate", "interactive")


@functools.lru_cache(maxsize=None)
def _docs(overlay: str = "ci-gate") -> tuple[dict, ...]:
    """What `kubectl apply -k deploy/kubernetes/overlays/OVERLAY` would apply."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with Kustomize) renders the overlays: the machine image ships it"
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


@pytest.mark.parametrize("overlay,doc", [(o, d) for o in OVERLAYS for d in _docs(o)],
                         ids=lambda v: v if isinstance(v, str) else f"{v['kind']}/{v['metadata']['name']}")
def test_each_manifest_validates_strictly(overlay, doc):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_a_broken_manifest_is_caught():
    bad = next(d for d in _docs() if d["kind"] == "Deployment")  # the workers
    bad = {**bad, "spec": {**bad["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_starts_when_its_workers_have_joined(overlay):
    """The overlay's worker count and the master's LOCUST_EXPECT_WORKERS come from the same overlay, and agree; the
    image is pinned to a version."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs(overlay)}
    config = docs[("ConfigMap", "vllm-load")]["data"]
    assert int(config["LOCUST_EXPECT_WORKERS"]) == docs[("Deployment", "vllm-load-worker")]["spec"]["replicas"]
    images = {c["image"] for d in docs.values() for c in d.get("spec", {}).get("template", {}).get("spec", {})
              .get("containers", [])}
    assert images == {"vllm-load:0.1.0"}, images


def test_the_interactive_master_keeps_its_web_ui_private():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs("interactive")}
    master = docs[("Deployment", "vllm-load-master")]
    service = docs[("Service", "vllm-load-master")]
    assert service["spec"]["selector"].items() <= master["spec"]["template"]["metadata"]["labels"].items()
    cmd = master["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--headless" not in cmd and "--web-host" not in cmd  # the pod's loopback: kubectl port-forward only
    assert [p["port"] for p in service["spec"]["ports"]] == [5557]  # the workers' port, not the web UI's
    assert ("Job", "vllm-load-master") not in docs


def test_workers_join_the_masters_service_and_the_web_ui_stays_private():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs()}
    service = docs[("Service", "vllm-load-master")]
    job = docs[("Job", "vllm-load-master")]
    master = job["spec"]["template"]["spec"]["containers"][0]
    worker = docs[("Deployment", "vllm-load-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    # a headless gate whose exit code is the Job's result, its run directory on the claimed volume
    assert "--headless" in master["command"] and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] in \
        {n for k, n in docs if k == "PersistentVolumeClaim"}
    sidecar = docs[("Service", "vllm-load-sidecar")]["spec"]["ports"][0]["port"]
    config = docs[("ConfigMap", "vllm-load")]["data"]
    assert config["VLLM_LOAD_SIDECAR_URL"].endswith(f"vllm-load-sidecar:{sidecar}")
    cmd = worker["command"]
    assert cmd[cmd.index("--master-host") + 1] == "vllm-load-master"
    assert int(cmd[cmd.index("--master-port") + 1]) == service["spec"]["ports"][0]["port"] == 5557
    assert [p["port"] for p in service["spec"]["ports"]] == [5557] and service["spec"]["type"] == "ClusterIP"
    assert "--web-host" not in master["command"]  # vllm-load's default: the pod's loopback (port-forward only)
    for c in (master, worker):
        assert not any("value" in e and "KEY" in e["name"] for e in c.get("env", []))  # secrets from a Secret
        assert c["image"] == master["image"]


@pytest.mark.parametrize("overlay,role", [("ci-gate", "master"), ("ci-gate", "worker"), ("interactive", "master")])
def test_the_commands_use_flags_the_image_knows(overlay, role, tmp_path):
    doc = next(d for d in _docs(overlay) if d["kind"] in ("Job", "Deployment")
               and d["metadata"]["labels"]["role"] == role)
    cmd = doc["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[:3] == ["locust", "-f", "locustfiles/chat.py"]
    # --list: Locust parses the whole command line (vllm-load's options included), lists the users and exits; a
    # flag that does not exist fails with exit 2 (--help would print before looking at the rest)
    def parse(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / cmd[2]), *cmd[3:], *extra, "--list"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=60)

    res = parse()
    assert res.returncode == 0 and "ChatUser" in res.stdout, res.stderr[-2000:]
    assert parse("--no-such-flag", "1").returncode == 2


@pytest.mark.parametrize("outcome,code", [("complete", 0), ("failed", 3), ("failed", 5)])
def test_the_gate_waiter_returns_at_the_jobs_end_with_the_masters_exit_code(tmp_path, outcome, code):
    """wait-for-gate.sh against a stand-in kubectl whose Job ends (``outcome``) at once and whose other wait would
    last its whole timeout: the script returns at once, with the master container's own exit code."""
    fake = tmp_path / "kubectl"
    fake.write_text(f"""#!/usr/bin/env bash
case "$1 $2" in
  "wait --for=condition={outcome}") exit 0 ;;
  "wait "*) exec sleep 600 ;;
  "get pod") echo -n {code} ;;
esac
""")
    fake.chmod(0o755)
    started = time.monotonic()
    res = subprocess.run(["bash", str(ROOT / "deploy" / "kubernetes" / "wait-for-gate.sh"), "vllm-load-master", "2h"],
                         env=dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}"), capture_output=True,
                         text=True, timeout=60)
    assert time.monotonic() - started < 30  # not the other wait's 600 s
    assert res.returncode == code and f"finished with exit code {code}" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_swarm_and_the_sidecar_each_require_a_token_from_the_secret(overlay):
    """The base's swarm had no swarm token (any pod that reached the master's port could join and change the
    result) and its sidecar served the server's series to anyone in the cluster: every load process reads
    VLLM_LOAD_SWARM_TOKEN, and the sidecar and the master VLLM_LOAD_SIDECAR_TOKEN, each from the Secret (required:
    a pod without it does not start), none on a command line."""
    def env(doc: dict) -> dict[str, dict]:
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("valueFrom", {}).get("secretKeyRef", {}) for e in container.get("env", [])}

    pods = {d["metadata"]["name"]: d for d in _docs(overlay) if d["kind"] in ("Deployment", "Job")}
    want = {"vllm-load-master": {"VLLM_LOAD_SWARM_TOKEN": "swarm-token", "VLLM_LOAD_SIDECAR_TOKEN": "sidecar-token"},
            "vllm-load-worker": {"VLLM_LOAD_SWARM_TOKEN": "swarm-token"},
            "vllm-load-sidecar": {"VLLM_LOAD_SIDECAR_TOKEN": "sidecar-token"}}
    assert set(pods) == set(want)
    for name, keys in want.items():
        got = env(pods[name])
        for var, key in keys.items():
            assert got[var] == {"name": "vllm-load", "key": key}, (name, got)  # required: no optional: true
        command = " ".join(pods[name]["spec"]["template"]["spec"]["containers"][0]["command"])
        assert "token" not in command, command
