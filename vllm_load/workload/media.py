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
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_load.errors import UsageError
from vllm_load.workload.lengths import LengthSpec, parse_length

JPEG_QUALITY = 85
AUDIO_RATE = 16_000  # Hz: what speech models (Whisper, Qwen2-Audio, Ultravox) resample to
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

    def clip(self) -> tuple[bytes, str]:
        """The next file's bytes and name (speech to text sends them as they are, in a form)."""
        path = self.files[self.next % len(self.files)]
        self.next += 1
        return path.read_bytes(), path.name

    def part(self) -> dict[str, Any]:
        path = self.files[self.next % len(self.files)]
        self.next += 1
        data = self._cache.get(path)
        if data is None:
            data = self._cache[path] = base64.b64encode(path.read_bytes()).decode()
        kind = self.kinds[path.suffix.lower()]
        if kind.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{data}"}}
        return {"type": "input_audio", "input_audio": {"data": data, "format": kind}}


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
