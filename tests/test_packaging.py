"""The wheel alone runs the chat locustfile: no checkout, no top-level `server` module installed."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile

from tests.helpers import ROOT


def run(cmd: list[str], cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, (cmd, res.stdout[-3000:], res.stderr[-3000:])
    return res


def test_a_wheel_installed_outside_the_checkout_runs_the_chat_locustfile(tmp_path):
    # built from a copy of the sources: setuptools writes build/ and *.egg-info beside them
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "reports", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", "*.so"))
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
        cwd=tmp_path)
    wheel = next(dist.glob("vllm_load-*.whl"))
    with zipfile.ZipFile(wheel) as zf:  # a plain `pip install` of it brings what it needs
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert not any(n.startswith("server/") for n in zf.namelist())
        if sys.platform.startswith("linux"):  # the wheel's build compiled the native reader
            for ext in ("vllm_load/client/_rxnative", "vllm_load/metrics/_hdrnative"):
                assert any(n.startswith(ext) and n.endswith(".so") for n in zf.namelist()), ext
    for dep in ("locust", "gevent", "orjson", "transformers", "hdrhistogram", "prometheus_client", "Jinja2"):
        assert f"Requires-Dist: {dep}" in meta, dep
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=tmp_path)
    # The dependencies (Locust, transformers, …: ~1 GB) come from this test's own environment through a path
    # entry; a path entry does not run that environment's .pth files, so its editable vllm-load stays out.
    fresh_site = next((venv / "lib").glob("python3*/site-packages"))
    (fresh_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_LOAD_API_KEY")}
    where = run([str(py), "-c", "import vllm_load, vllm_load_server; print(vllm_load.__file__); "
                 "print(vllm_load_server.__file__)"], cwd=tmp_path, env=env).stdout.split()
    assert all(path.startswith(str(venv)) for path in where), where  # the wheel's copies, not the checkout's
    gone = subprocess.run([str(py), "-c", "import server"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert gone.returncode != 0 and "No module named 'server'" in gone.stderr
    locustfile = run([str(venv / "bin" / "vllm-load"), "locustfile", "chat"], cwd=tmp_path, env=env).stdout.strip()
    assert locustfile.startswith(str(venv)) and locustfile.endswith("chat.py")
    if sys.platform.startswith("linux"):
        said = run([str(venv / "bin" / "vllm-load"), "native"], cwd=tmp_path, env=env).stdout
        assert said.startswith("native reader: in use") and str(venv) in said, said
    # what is tested is the wheel's files, not the client's timing: on a busy host the run may be untrustworthy
    res = run([str(py), "-m", "locust", "-f", locustfile, "--headless", "-u", "2", "-r", "2", "-t", "3s",
               "--output-tokens", "8", "--allow-untrustworthy", "--run-dir", str(tmp_path / "run")], cwd=tmp_path,
              env=env)
    assert "EMULATOR" in res.stdout and "(exit code 0)" in res.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    assert summary["succeeded"] > 0 and summary["failed"] == 0
    report = (tmp_path / "run" / "report.html").read_text()  # its template and chart script came in the wheel
    assert "id='verdict-block'" in report and "uPlot" in report and 'id="chart-data"' in report
