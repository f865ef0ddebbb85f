"""Tests of other things hold on a busy host: a subset of the suite, run while two CPU-bound loops hold every core
this test may use. On a shared 2-core machine at load 6-18 the suite once ended 14 failed: runs that exited 5
(untrustworthy) in tests of something else, 3 s runs of two processes that sent nothing, a timing bound one gap
wide. Those tests now accept a busy client, end by their count, or time what the host cannot delay."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT

#: one test each of the kinds that failed there (two processes with media, a timed reasoning stream) and of a
#: window read from the timeline (the steady window by time): ~60 s beside the loops, kept short for CI's hour
SUBSET = ("tests/test_media.py::test_chat_with_images_reports_media_tokens_apart_and_sends_no_image_twice",
          "tests/test_reasoning.py::test_a_reasoning_model_reports_ttfo_after_its_thinking",
          "tests/test_steady.py::test_a_closed_loop_run_reports_its_steady_window_and_judges_the_slos_on_it[time]")

BUSY = ("import os, sys; from vllm_load.lifeline import die_with_parent; die_with_parent(int(sys.argv[1])); "
        "os.sched_setaffinity(0, {int(sys.argv[2])})\nwhile True: pass")


def test_a_subset_of_the_suite_passes_beside_a_busy_loop_on_every_core(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    loops = [subprocess.Popen([sys.executable, "-c", BUSY, str(os.getpid()), str(core)], env=env) for core in cores]
    try:
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                              str(tmp_path / "t"), *SUBSET], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        assert all(p.poll() is None for p in loops)  # they were busy all along
    finally:
        for p in loops:
            p.kill()
            p.wait(timeout=10)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"{len(SUBSET)} passed" in res.stdout
