"""Speech to text (/v1/audio/transcriptions and /translations, as vLLM 0.32 serves a Whisper-style model): the form
the client sends, the emulator serving it, and runs whose requests, prompt and output tokens equal the server's
own counters, with each clip's length and real-time factor."""

from __future__ import annotations

import io
import json
import wave
from email.parser import BytesParser
from email.policy import HTTP

import pytest

from tests.helpers import ROOT, counter, run_in_process
from vllm_load.client.apis.audio import audio_tokens, count_input, decoder_prompt, transcription_request
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.media import MediaMaker, wav_seconds


def parts(ready) -> dict[str, bytes]:
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + ready.content_type.encode() + b"\r\n\r\n"
                                                  + ready.body)
    return {p.get_param("name", header="content-disposition"): p.get_payload(decode=True) for p in message.iter_parts()}


def test_the_form_carries_the_clip_and_asks_for_the_usage_never_a_forced_length():
    clip = MediaMaker("salt", "test").audio_bytes(2.5)
    ready = transcription_request("whisper", clip, 2.5, 260, 32, language="fr", prompt="before")
    got = parts(ready)
    assert got["file"] == clip and wav_seconds(got["file"]) == 2.5
    assert {k: v.decode() for k, v in got.items() if k != "file"} == {
        "model": "whisper", "language": "fr", "temperature": "0.0", "response_format": "json",
        "max_completion_tokens": "32", "prompt": "before", "stream": "true", "stream_include_usage": "true",
        "stream_continuous_usage_stats": "true"}
    assert (ready.path, ready.input_tokens, ready.output_tokens, ready.max_tokens, ready.audio_seconds) == \
        ("/v1/audio/transcriptions", 260, None, 32, 2.5)
    whole = transcription_request("whisper", clip, 2.5, None, None, api="translation", stream=False)
    assert whole.path == "/v1/audio/translations" and not whole.streamed
    assert not {"stream", "max_completion_tokens"} & set(parts(whole))


def test_the_prompt_count_is_the_decoders_text_and_a_token_per_10ms_of_audio():
    assert decoder_prompt("en", "transcribe") == "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    assert decoder_prompt("de", "translate", "hi").startswith("<|prev|>hi<|startoftranscript|><|de|><|translate|>")
    assert [audio_tokens(s) for s in (0.01, 1.0, 1.005, 2.5)] == [1, 100, 101, 250]
    assert count_input(lambda text, special: list(text), 1.0, "transcription") == \
        len(decoder_prompt("en", "transcribe")) + 100
    assert count_input(lambda text, special: [], None, "transcription") is None  # an mp3: only a decoder knows


def wav(target, seconds: float) -> None:
    with wave.open(target if isinstance(target, io.BytesIO) else str(target), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x01\x00" * int(16000 * seconds))


def test_transcription_locustfile_counts_equal_the_servers(tmp_path, emulator_factory):
    emu = emulator_factory()
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/transcription.py"), "--headless", "-u", "2", "-r", "2", "-t",
                          "60s", "--num-requests", "8", "--audio-seconds", "2.5", "--output-tokens", "12",
                          "--host", emu.url, "--slo", "rtf.p99<=5", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 8 and all(r["ok"] and r["api"] == "transcription" for r in logs), [r["error"] for r in logs]
    for r in logs:  # exact input (the decoder's text and 250 frames), the answer as long as the cap
        assert r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] and r["output_tokens"] == 12
        assert r["clip_seconds"] == 2.5 and r["rtf"] == pytest.approx(r["e2e"] / 2.5)
        assert len(r["chunk_offsets"]) == 12 and r["finish_reason"] == "length"
    assert counter(emu.url, "vllm:request_success_total") == 8
    # as vLLM 0.32 counts a Whisper request (tests/test_real_vllm_speech.py): /metrics' prompt tokens are the
    # decoder's alone, the audio's frames are in the usage only; no prefix cache for an encoder-decoder model
    assert counter(emu.url, "vllm:prompt_tokens_total") == sum(r["input_tokens"] - 250 for r in logs)
    assert counter(emu.url, "vllm:prefix_cache_queries_total") == 0
    assert counter(emu.url, "vllm:generation_tokens_total") == 8 * 12
    m = json.loads((run_dir / "summary.json").read_text())["summary"]["metrics"]
    assert m["clip_seconds"]["count"] == 8 and m["clip_seconds"]["p50"] == pytest.approx(2.5, abs=1e-3)
    assert m["rtf"]["count"] == 8
    assert "Real-time factor" in res.stdout and "PASS  rtf.p99<=5" in res.stdout


def test_a_users_own_clips_generated_by_path_and_whole(tmp_path, emulator_factory):
    emu = emulator_factory()
    wav(tmp_path / "speech.wav", 1.25)
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "tests/locustfiles/speech.py"), "--headless", "-u", "1", "-r", "1", "-t",
                          "60s", "--num-requests", "6", "--host", emu.url, "--run-dir", str(run_dir)], cwd=tmp_path,
                         env_extra={"SPEECH_TEST_WAV": str(tmp_path / "speech.wav")})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = {r["name"]: r for r in read_log(run_dir / "requests.jsonl")}
    assert set(logs) == {"generated", "file", "whole"} and all(r["ok"] for r in logs.values()), logs
    gen, file, whole = logs["generated"], logs["file"], logs["whole"]
    assert gen["api"] == "transcription" and gen["clip_seconds"] == 1.5 and gen["output_tokens"] == 6
    assert gen["input_tokens"] == gen["input_tokens_asked"]
    assert file["api"] == "translation" and file["clip_seconds"] == 1.25 and file["output_tokens"] == 4
    assert file["input_tokens"] == file["input_tokens_asked"]
    # answered whole: its usage is the clip's seconds (vLLM's duration usage), no token counts; timed to its end
    assert whole["api"] == "transcription" and not whole["chunk_offsets"] and whole["rtf"] == whole["e2e"] / 1.25
    assert whole["output_tokens"] is None and whole["input_tokens"] == whole["input_tokens_asked"]


def test_the_emulator_answers_a_whole_clip_and_refuses_what_vllm_refuses(emulator_factory):
    import urllib.error
    import urllib.request

    emu = emulator_factory()
    model = json.loads(urllib.request.urlopen(emu.url + "/v1/models", timeout=10).read())["data"][0]["id"]

    def post(body: bytes, kind: str) -> tuple[int, dict]:
        req = urllib.request.Request(emu.url + "/v1/audio/transcriptions", data=body, headers={"Content-Type": kind})
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, {}

    buf = io.BytesIO()
    wav(buf, 1.5)
    whole = transcription_request(model, buf.getvalue(), 1.5, None, 4, stream=False)
    status, answer = post(whole.body, whole.content_type)
    # vLLM's whole answer: the text, and the clip's seconds rounded up as its usage
    assert status == 200 and answer["usage"] == {"type": "duration", "seconds": 2} and answer["text"]
    assert post(b'{"model": "x"}', "application/json")[0] == 400  # a form, not JSON
    not_wav = transcription_request(model, b"ID3 an mp3", None, None, 4)
    assert post(not_wav.body, not_wav.content_type)[0] == 400  # the emulator measures WAV only
    other = transcription_request("not-served", buf.getvalue(), 1.5, None, 4)
    assert post(other.body, other.content_type)[0] == 404


def test_speechs_clips_and_chats_media_come_from_one_maker_and_never_repeat():
    """A process that sends chat.py's clips and speech to text's (two user classes) makes both in its prompt thread:
    a second maker of the same source made the same first clip for each."""
    import base64
    import random
    from types import SimpleNamespace

    from vllm_load.client.stream import BodyDefaults
    from vllm_load.plugin.requests.llm_speech import workload_request
    from vllm_load.workload.lengths import parse_length
    from vllm_load.workload.media import WorkloadMedia

    opts = SimpleNamespace(audio_seconds=1.0, audio_from="")
    media = WorkloadMedia(opts, "salt", "w0", "draws")
    chat_clip = base64.b64decode(media.parts(random.Random(0))[0]["input_audio"]["data"])
    src = SimpleNamespace(opts=opts, media=lambda: media, next_model=lambda: ("m", None),
                          tokenizer=SimpleNamespace(encode=lambda text, special: [1]), output_spec=parse_length("8", "x"),
                          rng=random.Random(0), defaults=BodyDefaults())
    clips = [parts(workload_request(src, "transcription"))["file"] for _ in range(2)]
    assert len({chat_clip, *clips}) == 3 and all(wav_seconds(c) == 1.0 for c in clips)
