"""Images and audio: unique content parts, their prompt tokens reported apart from the exact text tokens, and
the emulator's charge for them (one token per 28x28 patch, 25 per second of audio)."""

from __future__ import annotations

import json
import math

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.media import MediaMaker, parse_image_size


def test_images_and_clips_are_unique_and_decodable():
    import io
    import wave

    from PIL import Image

    a, b = MediaMaker("salt", "w0"), MediaMaker("salt", "w1")
    images = [a.image_bytes(64, 48) for _ in range(3)] + [b.image_bytes(64, 48)]
    assert len(set(images)) == 4 and Image.open(io.BytesIO(images[0])).size == (64, 48)
    clip = a.audio_bytes(0.5)
    with wave.open(io.BytesIO(clip)) as w:
        assert (w.getframerate(), w.getnframes()) == (16000, 8000)
    assert clip != a.audio_bytes(0.5)
    import random
    size = parse_image_size("256x256,100-200x50")
    drawn = {size.sample(random.Random(i)) for i in range(50)}
    assert (256, 256) in drawn and all(s == (256, 256) or (100 <= s[0] <= 200 and s[1] == 50) for s in drawn)


def test_chat_with_images_reports_media_tokens_apart_and_sends_no_image_twice(tmp_path, emulator_factory):
    log = tmp_path / "bodies.jsonl"
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005", "--request-log", str(log))
    run_dir = tmp_path / "run"
    # ended by its count, -t a bound: two processes starting on a busy host once sent nothing in a 3 s run
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "90s",
                          "--num-requests", "12",
                          "--host", emu.url, "--processes", "2", "--images-per-request", "2", "--image-size", "256x256",
                          "--audio-seconds", "2", "--input-tokens", "64", "--output-tokens", "8",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f)]
    charge = 2 * math.ceil(256 / 28) ** 2 + 2 * 25  # two images of 10x10 patches, 2 s of audio
    assert len(logs) >= 8 and all(r["ok"] and r["media"] == 3 for r in logs)
    assert all(r["input_tokens_asked"] == 64 and r["media_tokens"] == charge for r in logs)
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["media_items"] == 3 * len(logs) and s["media_tokens"] == charge * len(logs)
    assert s["text_input_tokens"] == 64 * len(logs) and s["input_drift_requests"] == 0
    # no warning but the client's own timing, which a busy host may make untrustworthy (allowed here)
    assert "media: " in res.stdout
    assert [x for x in res.stdout.splitlines() if "WARNING" in x and "UNTRUSTWORTHY" not in x] == []
    parts = [p for line in log.read_text().splitlines() for p in json.loads(line)["body"]["messages"][-1]["content"]
             if p["type"] != "text"]
    media = [p["image_url"]["url"] if p["type"] == "image_url" else p["input_audio"]["data"] for p in parts]
    assert len(media) >= 3 * len(logs) and len(set(media)) == len(media)  # no two byte-identical across workers


def test_a_users_own_image_and_audio(tmp_path):
    run_dir = tmp_path / "run"
    # ended by its count: a 2 s run once completed no request beside two busy loops ("measured nothing", exit 4)
    res = run_in_process(["-f", str(ROOT / "tests/locustfiles/vision.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert logs and all(r["ok"] and r["media"] == 2 for r in logs), [r["error"] for r in logs][:3]
    # 280x140: 10x5 patches; 2 s of audio: 50
    assert all(r["media_tokens"] == 50 + 50 for r in logs)


def test_images_and_clips_from_folders(tmp_path, emulator_factory):
    """--images-from / --audio-from: the files, in turn; the emulator charges each by its own size and length."""
    import io
    import wave

    from PIL import Image

    folder = tmp_path / "pics"
    folder.mkdir()
    for name, size in (("a.png", (56, 56)), ("b.jpg", (112, 28))):
        Image.new("RGB", size, (200, 10, 10)).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    clip = tmp_path / "clip.wav"
    with wave.open(str(clip), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(b"\0\0" * 16000)  # 1 s
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.003")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "2s",
                          "--host", emu.url, "--images-per-request", "1", "--images-from", str(folder), "--audio-from",
                          str(clip), "--input-tokens", "40", "--output-tokens", "4", "--run-dir", str(run_dir)],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    # a.png: 2x2 patches, b.jpg: 4x1; 1 s of audio: 25 tokens
    assert logs and {r["media_tokens"] for r in logs} == {4 + 25}, sorted({r["media_tokens"] for r in logs})
    bad = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-t", "2s", "--host", emu.url,
                          "--images-per-request", "1", "--images-from", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "--images-from" in bad.stderr and "no " in bad.stderr
