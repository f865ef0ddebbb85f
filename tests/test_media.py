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
    assert logs and all(r["ok"] and r["media"] == 3 for r in logs), [r["error"] for r in logs][:3]
    # 280x140: 10x5 patches; 2 s of audio: 50; 4 frames of 56x56: 2 pairs of 2x2 squares
    assert all(r["media_tokens"] == 50 + 50 + 8 for r in logs)


def test_images_and_clips_from_folders(tmp_path, emulator_factory):
    """--images-from / --audio-from: the files, in turn; the emulator charges each by its own size and length."""
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


def test_a_generated_video_is_a_motion_jpeg_avi_of_its_frames_unique_per_call():
    import io
    import struct

    from PIL import Image

    from vllm_load.workload.media import MediaMaker, avi_shape

    maker = MediaMaker("salt", "test")
    one, two = maker.video_bytes(5, 64, 48), maker.video_bytes(5, 64, 48)
    assert one != two and avi_shape(one) == (5, 64, 48) and avi_shape(b"\x00\x00\x00\x18ftypmp42") is None
    assert one[:4] == b"RIFF" and struct.unpack_from("<I", one, 4)[0] == len(one) - 8  # the container's own size
    frames, at = [], one.index(b"movi") + 4
    while one[at:at + 4] == b"00dc":  # each frame a JPEG of the size asked, the index pointing at it
        size = struct.unpack_from("<I", one, at + 4)[0]
        frames.append(Image.open(io.BytesIO(one[at + 8:at + 8 + size])).size)
        at += 8 + size + size % 2
    assert frames == [(64, 48)] * 5 and one[at:at + 4] == b"idx1" and struct.unpack_from("<I", one, at + 4)[0] == 5 * 16


def test_chat_with_videos_charges_each_as_its_frames_and_the_multimodal_cache_counts_items(tmp_path, emulator_factory):
    """Generated videos are never byte-identical (no multimodal cache hit); a file sent again is one."""
    from tests.helpers import counter
    from vllm_load.workload.media import MediaMaker

    emu = emulator_factory("--ttft", "0.01", "--itl", "0.003")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "6", "--host", emu.url, "--videos-per-request", "1", "--video-frames", "6",
                          "--video-size", "64x48", "--input-tokens", "40", "--output-tokens", "4",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    # Qwen2-VL's charge: 3 pairs of frames, each 3x2 squares of 28 px; the text exact beside it
    assert len(logs) == 6 and all(r["media"] == 1 and r["media_tokens"] == 3 * 3 * 2 for r in logs)
    assert all(r["input_tokens_asked"] == 40 for r in logs)
    assert counter(emu.url, "vllm:mm_cache_queries_total") == 6 and counter(emu.url, "vllm:mm_cache_hits_total") == 0
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "only.avi").write_bytes(MediaMaker("salt", "file").video_bytes(4, 56, 56))
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
                          "--num-requests", "3", "--host", emu.url, "--videos-per-request", "1", "--videos-from",
                          str(folder), "--input-tokens", "40", "--output-tokens", "4", "--run-dir",
                          str(tmp_path / "files")], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert {r["media_tokens"] for r in read_log(tmp_path / "files" / "requests.jsonl")} == {2 * 2 * 2}
    assert counter(emu.url, "vllm:mm_cache_queries_total") == 9 and counter(emu.url, "vllm:mm_cache_hits_total") == 2
    bad = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-t", "2s", "--host", emu.url,
                          "--videos-from", str(folder)], cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "--videos-per-request" in bad.stderr
