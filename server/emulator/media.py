"""Multimodal chat content, as a vision/audio model's server charges it: ``image_url`` parts (data URLs, or
http URLs, which are never fetched: they count as DEFAULT_SIZE), ``input_audio`` parts (WAV) and
``video_url`` parts become placeholder tokens after the text, so usage.prompt_tokens = the text's tokens +
the media's, and each medium adds its encoder time to the prefill. Every item is looked up in the multimodal
processor cache by its bytes (``MultiModalCache``: ``vllm:mm_cache_queries`` / ``_hits``, in items, as vLLM V1
counts them).

Image tokens follow Qwen2-VL: one token per 28x28 patch of the image (``--image-patch``); audio, a rate per
second (``--audio-tokens-per-second``: Qwen2-Audio's 25); a video, Qwen2-VL's too: a token per 28x28 patch of
every two frames (its temporal patch), read from a Motion-JPEG AVI's header (another container or an http URL
counts as VIDEO_TOKENS). The placeholder ids derive
from the medium's bytes, so the prefix cache shares equal images (as vLLM's multimodal hashes do) and never
two different ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import struct
import wave
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_SIZE = (512, 512)  # an http image (never fetched)
VIDEO_TOKENS = 256


@dataclass(frozen=True)
class MediaCost:
    image_patch: int = 28
    audio_tokens_per_second: float = 25.0
    encode_seconds: float = 0.0  # encoder time per image, clip or video, added before the first token


class MediaError(ValueError):
    """A part vLLM would answer 400."""


def _data(url: str) -> bytes:
    head, _, payload = url.partition(",")
    if not head.startswith("data:") or ";base64" not in head:
        raise MediaError("image_url must be a base64 data URL or an http(s) URL")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("image_url's data URL is not valid base64") from None


def _placeholders(data: bytes, n: int) -> list[int]:
    seed = hashlib.sha256(data).digest()
    return [(seed[i % 32] << 8 | i) & 0xFFFF for i in range(n)]


def flatten(messages: list[dict[str, Any]], cost: MediaCost) -> tuple[list[dict[str, Any]], list[int], list[bytes]]:
    """The messages with each content list made its text, the media's placeholder ids, and each item's key (its
    bytes' digest: what the multimodal cache looks up)."""
    out, ids, keys = [], [], []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                url = str((part.get("image_url") or {}).get("url", ""))
                if url.startswith(("http://", "https://")):
                    data, (w, h) = url.encode(), DEFAULT_SIZE
                else:
                    data = _data(url)
                    w, h = _image_size(data)
                ids += _placeholders(data, math.ceil(w / cost.image_patch) * math.ceil(h / cost.image_patch))
                keys.append(hashlib.sha256(data).digest())
            elif kind == "input_audio":
                raw = (part.get("input_audio") or {}).get("data", "")
                try:
                    data = base64.b64decode(raw, validate=True)
                except (binascii.Error, ValueError):
                    raise MediaError("input_audio must carry base64 WAV data") from None
                seconds = wav_seconds(data, "input_audio must carry base64 WAV data")
                ids += _placeholders(data, max(1, math.ceil(seconds * cost.audio_tokens_per_second)))
                keys.append(hashlib.sha256(data).digest())
            elif kind == "video_url":
                url = str((part.get("video_url") or {}).get("url", ""))
                data = url.encode() if url.startswith(("http://", "https://")) else _data(url)
                ids += _placeholders(data, video_tokens(data, cost.image_patch))
                keys.append(hashlib.sha256(data).digest())
            else:
                raise MediaError(f"unsupported content part type {kind!r}")
        out.append({**m, "content": "".join(texts)})
    return out, ids, keys


def wav_seconds(data: bytes, refused: str) -> float:
    """A WAV clip's length (``MediaError(refused)`` for anything else): chat's ``input_audio``, speech to text's
    file."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            return w.getnframes() / float(w.getframerate())
    except (wave.Error, EOFError, ZeroDivisionError):
        raise MediaError(refused) from None


def video_tokens(data: bytes, patch: int, temporal: int = 2) -> int:
    """Qwen2-VL's charge for a video: a token per ``patch`` x ``patch`` square of every ``temporal`` frames."""
    if not data.startswith(b"RIFF") or data[8:12] != b"AVI ":
        return VIDEO_TOKENS
    at = data.find(b"avih", 12, 256)
    if at < 0 or len(data) < at + 48:
        raise MediaError("video_url's AVI has no main header")
    frames = struct.unpack_from("<I", data, at + 24)[0]
    width, height = struct.unpack_from("<II", data, at + 40)
    return math.ceil(frames / temporal) * math.ceil(width / patch) * math.ceil(height / patch)


class MultiModalCache:
    """vLLM's multimodal processor cache, in items: an item seen before (the same bytes) is a hit; least recently
    used items go first past ``capacity``."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity, self.seen = capacity, OrderedDict()

    def query(self, keys: list[bytes]) -> int:
        hits = 0
        for key in keys:
            if key in self.seen:
                hits += 1
                self.seen.move_to_end(key)
            else:
                self.seen[key] = None
                if len(self.seen) > self.capacity:
                    self.seen.popitem(last=False)
        return hits


def _image_size(data: bytes) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (UnidentifiedImageError, OSError):
        raise MediaError("image_url's data is not an image") from None
