"""Images and audio for multimodal requests: content parts (data URLs) unique per call, so that neither
vLLM's multimodal cache nor its prefix cache can share them, and cheap to make.

An image is a fixed smooth picture per size (made once) whose first row carries a digest of the run's salt,
this process and a sequence number, encoded as JPEG by Pillow (which releases the GIL while it encodes): a
few milliseconds at 512x512, in the prompt thread or the helper thread, never on the event loop. A clip is a
16 kHz mono WAV of a tone whose first samples carry the same kind of digest.
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import re
import struct
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_load.errors import UsageError
from vllm_load.workload.lengths import LengthSpec, parse_length

JPEG_QUALITY = 85
AUDIO_RATE = 16_000  # Hz: what speech models (Whisper, Qwen2-Audio, Ultravox) resample to
VIDEO_FPS = 2.0  # frames a second of a generated clip: what Qwen2-VL's processor samples a video at
_SIZE = re.compile(r"^\s*(\S+?)x(\S+)\s*$")


@dataclass(frozen=True)
class ImageSize:
    """``--image-size``: a list of WxH choices, each side a length spec (512x512, 256-1024x512, …)."""

    choices: tuple[tuple[LengthSpec, LengthSpec], ...]
    text: str

    def sample(self, rng: random.Random) -> tuple[int, int]:
        w, h = rng.choice(self.choices)
        return w.sample(rng), h.sample(rng)


def parse_image_size(spec: str, option: str = "--image-size") -> ImageSize:
    choices = []
    for part in str(spec).split(","):
        m = _SIZE.match(part)
        if not m:
            raise UsageError(f"{option} {spec!r} is not WxH: give e.g. 512x512, 256-1024x512 or 256x256,1024x768")
        choices.append((parse_length(m.group(1), option), parse_length(m.group(2), option)))
    return ImageSize(tuple(choices), str(spec))


IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
               ".gif": "image/gif", ".bmp": "image/bmp"}
AUDIO_TYPES = {".wav": "wav", ".mp3": "mp3"}
VIDEO_TYPES = {".mp4": "video/mp4", ".avi": "video/x-msvideo", ".webm": "video/webm", ".mov": "video/quicktime"}


class MediaFiles:
    """``--images-from`` / ``--audio-from``: a file, or a folder's files of the known types, sent as they are, in
    turn (seeded order per process). Unlike generated media, a file sent twice can hit vLLM's multimodal cache."""

    def __init__(self, path: str, kinds: dict[str, str], option: str, rng: random.Random) -> None:
        from pathlib import Path

        root = Path(path)
        files = sorted(p for p in (root.iterdir() if root.is_dir() else [root]) if p.suffix.lower() in kinds)
        if not root.exists() or not files:
            raise UsageError(f"{option} {path}: no {'/'.join(sorted(kinds))} file there: give a file or a folder of them")
        rng.shuffle(files)
        self.files, self.kinds, self.next = files, kinds, 0
        self._cache: dict = {}

    def _next_path(self) -> Any:
        path = self.files[self.next % len(self.files)]
        self.next += 1
        return path

    def clip(self) -> tuple[bytes, str]:
        """The next file's bytes and name (speech to text sends them as they are, in a form)."""
        path = self._next_path()
        return path.read_bytes(), path.name

    def part(self) -> dict[str, Any]:
        path = self._next_path()
        data = self._cache.get(path)
        if data is None:
            data = self._cache[path] = base64.b64encode(path.read_bytes()).decode()
        kind = self.kinds[path.suffix.lower()]
        if kind.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{data}"}}
        if kind.startswith("video/"):
            return {"type": "video_url", "video_url": {"url": f"data:{kind};base64,{data}"}}
        return {"type": "input_audio", "input_audio": {"data": data, "format": kind}}


def avi(jpegs: list[bytes], width: int, height: int, fps: float) -> bytes:
    """Motion-JPEG frames in an AVI (RIFF) container: the main and stream headers, the frames, their index."""
    def chunk(fourcc: bytes, data: bytes) -> bytes:
        return fourcc + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")

    def riff_list(kind: bytes, fourcc: bytes, data: bytes) -> bytes:
        return kind + struct.pack("<I", len(data) + 4) + fourcc + data

    n, biggest = len(jpegs), max(len(j) for j in jpegs)
    avih = struct.pack("<10I4I", int(1e6 / fps), biggest * int(fps + 1), 0, 0x10, n, 0, 1, biggest, width, height,
                       0, 0, 0, 0)
    strh = b"vidsMJPG" + struct.pack("<IHHIIIIIIiI", 0, 0, 0, 0, 1000, int(fps * 1000), 0, n, biggest, -1, 0) + \
        struct.pack("<4h", 0, 0, width, height)
    strf = struct.pack("<IiiHH4sIiiII", 40, width, height, 1, 24, b"MJPG", width * height * 3, 0, 0, 0, 0)
    hdrl = riff_list(b"LIST", b"hdrl", chunk(b"avih", avih) +
                     riff_list(b"LIST", b"strl", chunk(b"strh", strh) + chunk(b"strf", strf)))
    frames, index, offset = [], [], 4  # idx1's offsets count from the 'movi' fourcc
    for j in jpegs:
        framed = chunk(b"00dc", j)
        index.append(b"00dc" + struct.pack("<III", 0x10, offset, len(j)))
        frames.append(framed)
        offset += len(framed)
    movi = riff_list(b"LIST", b"movi", b"".join(frames))
    return riff_list(b"RIFF", b"AVI ", hdrl + movi + chunk(b"idx1", b"".join(index)))


def avi_shape(data: bytes) -> tuple[int, int, int] | None:
    """An AVI's (frames, width, height) from its main header, or None for another container."""
    header = data.find(b"avih", 12, 256)
    if data[:4] != b"RIFF" or data[8:12] != b"AVI " or header < 0:
        return None
    at = header + 8
    frames, width, height = struct.unpack_from("<I", data, at + 16)[0], *struct.unpack_from("<II", data, at + 32)
    return frames, width, height


def wav_seconds(data: bytes) -> float | None:
    """A WAV clip's length from its header (None for another format: only a decoder would know)."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            return w.getnframes() / float(w.getframerate())
    except (wave.Error, EOFError, ZeroDivisionError):
        return None


@dataclass
class MediaMaker:
    """One per thread that makes media (a process's prompt thread, its helper thread): ``source`` keeps their
    digests apart, the sequence number makes every call's bytes new."""

    salt: str
    source: str
    seq: int = 0
    _bases: dict = field(default_factory=dict)

    def _digest(self) -> bytes:
        self.seq += 1
        return hashlib.sha256(f"{self.salt}/{self.source}/{self.seq}".encode()).digest()

    def _base(self, width: int, height: int) -> np.ndarray:
        base = self._bases.get((width, height))
        if base is None:
            if len(self._bases) > 64:
                self._bases.clear()
            y, x = np.mgrid[0:height, 0:width]
            base = np.stack([(x * 255 // max(1, width - 1)), (y * 255 // max(1, height - 1)),
                             ((x + y) * 127 // max(1, width + height - 2))], axis=-1).astype(np.uint8)
            self._bases[(width, height)] = base
        return base

    def image_bytes(self, width: int, height: int) -> bytes:
        """A unique JPEG of ``width`` x ``height``."""
        from PIL import Image

        if width < 1 or height < 1:
            raise ValueError(f"an image needs a positive size, got {width}x{height}")
        pixels = self._base(width, height).copy()
        mark = np.frombuffer(self._digest() * 3, dtype=np.uint8)  # 96 bytes: 32 RGB pixels
        n = min(width, 32)
        pixels[0, :n] = mark[: n * 3].reshape(n, 3)
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=JPEG_QUALITY)
        return out.getvalue()

    def image_part(self, width: int, height: int) -> dict[str, Any]:
        """An OpenAI chat content part: ``{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,…"}}``."""
        data = base64.b64encode(self.image_bytes(width, height)).decode()
        return {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{data}"}}

    def video_bytes(self, frames: int, width: int, height: int, fps: float = VIDEO_FPS) -> bytes:
        """A unique Motion-JPEG AVI of ``frames`` frames of ``width`` x ``height``: the image's gradient moving a
        column a frame, the digest on the first frame (what OpenCV, vLLM's video reader, decodes without FFmpeg)."""
        from PIL import Image

        if frames < 1 or width < 1 or height < 1:
            raise ValueError(f"a video needs frames and a size, got {frames} frames of {width}x{height}")
        base = self._base(width, height)
        mark = np.frombuffer(self._digest() * 3, dtype=np.uint8)
        jpegs = []
        for i in range(frames):
            pixels = np.roll(base, i, axis=1)
            if i == 0:
                pixels = pixels.copy()
                n = min(width, 32)
                pixels[0, :n] = mark[: n * 3].reshape(n, 3)
            out = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=JPEG_QUALITY)
            jpegs.append(out.getvalue())
        return avi(jpegs, width, height, fps)

    def video_part(self, frames: int, width: int, height: int) -> dict[str, Any]:
        """An OpenAI chat content part as vLLM reads one: ``{"type": "video_url", "video_url": {"url":
        "data:video/x-msvideo;base64,…"}}``."""
        data = base64.b64encode(self.video_bytes(frames, width, height)).decode()
        return {"type": "video_url", "video_url": {"url": f"data:video/x-msvideo;base64,{data}"}}

    def audio_bytes(self, seconds: float) -> bytes:
        """A unique 16 kHz mono 16-bit WAV of ``seconds``."""
        if not seconds > 0:
            raise ValueError(f"a clip needs a positive length, got {seconds} s")
        n = max(1, int(round(seconds * AUDIO_RATE)))
        t = np.arange(n, dtype=np.float32) / AUDIO_RATE
        samples = (np.sin(2 * np.pi * 440.0 * t) * 8000).astype(np.int16)
        mark = np.frombuffer(self._digest(), dtype=np.int16)
        samples[: min(n, mark.size)] = mark[: min(n, mark.size)]
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(AUDIO_RATE)
            w.writeframes(samples.tobytes())
        return out.getvalue()

    def audio_part(self, seconds: float) -> dict[str, Any]:
        """An OpenAI chat content part: ``{"type": "input_audio", "input_audio": {"data": base64, "format": "wav"}}``."""
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(self.audio_bytes(seconds)).decode(),
                                                       "format": "wav"}}


class WorkloadMedia:
    """The media after each chat prompt's text (chat.py): --images-per-request images (generated at --image-size or
    --images-from's files), one clip (--audio-seconds generated, or --audio-from's files), --videos-per-request
    videos (--video-frames frames at --video-size, or --videos-from's files); made in the prompt thread."""

    def __init__(self, opts: Any, salt: str, source: str, draws: str) -> None:
        self.images = int(getattr(opts, "images_per_request", 0) or 0)
        self.seconds = float(getattr(opts, "audio_seconds", 0.0) or 0.0)
        self.videos = int(getattr(opts, "videos_per_request", 0) or 0)
        self.frames = int(getattr(opts, "video_frames", 8) or 8)
        self.maker = MediaMaker(salt, f"{source}/pool")
        self.image_size = parse_image_size(getattr(opts, "image_size", "512x512"))
        self.video_size = parse_image_size(getattr(opts, "video_size", "224x224"), "--video-size")
        rng = random.Random(f"{draws}/{source}/media")

        def files(option: str, kinds: dict[str, str]) -> MediaFiles | None:
            path = getattr(opts, option.lstrip("-").replace("-", "_"), "")
            return MediaFiles(path, kinds, option, rng) if path else None

        self.image_files = files("--images-from", IMAGE_TYPES)
        self.audio_files = files("--audio-from", AUDIO_TYPES)
        self.video_files = files("--videos-from", VIDEO_TYPES)

    @staticmethod
    def wanted(opts: Any) -> bool:
        return bool(getattr(opts, "images_per_request", 0) or float(getattr(opts, "audio_seconds", 0.0) or 0.0) > 0
                    or getattr(opts, "audio_from", "") or getattr(opts, "videos_per_request", 0))

    def parts(self, rng: random.Random) -> list[dict[str, Any]]:
        out = [self.image_files.part() if self.image_files is not None
               else self.maker.image_part(*self.image_size.sample(rng)) for _ in range(self.images)]
        if self.audio_files is not None:
            out.append(self.audio_files.part())
        elif self.seconds > 0:
            out.append(self.maker.audio_part(self.seconds))
        out += [self.video_files.part() if self.video_files is not None
                else self.maker.video_part(self.frames, *self.video_size.sample(rng)) for _ in range(self.videos)]
        return out
