"""The embedded emulator's log and its sidecar's series live in private temporary files (mode 0600) that are
gone when the run exits (a 7-minute run once left 2.2 MB behind in the shared temp folder)."""

import os
import stat

from tests.helpers import ROOT, run_in_process


def test_private_temp_files_are_0600(tmp_path, monkeypatch):
    import tempfile

    from vllm_load.runtime.embedded import private_temp_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = private_temp_file("sidecar", ".jsonl")
    assert path.parent == tmp_path and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_an_embedded_emulator_run_leaves_nothing_in_the_temp_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "4",
                          "--output-tokens", "4", "--run-dir", str(tmp_path / "run")], cwd=tmp_path,
                         env_extra={"TMPDIR": str(tmp)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (tmp_path / "run" / "emulator.log").exists()  # its log was kept with the run
    assert [p.name for p in tmp.iterdir() if p.name.startswith("vllm-load")] == []
