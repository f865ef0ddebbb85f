"""Multimodal chat content, as a vision/audio model's server charges it: ``image_url`` parts (data URLs, or
http URLs, which are never fetched: they count as DEFAULT_SIZE), ``input_audio`` parts (WAV) and
``video_url`` parts become placeholder tokens after the text, so usage.prompt_tokens = the text's tokens +
the media's, and each medium adds its encoder time to the prefill.

Image tokens follow Qwen2-VL: one token per 28x28 patch of the image (``--image-patch``); audio, a rate per
second (``--audio-tokens-per-second``: Qwen2-Audio's 25); a video a fixed count. The placeholder ids derive
from the medium's bytes, so the prefix cache shares equal images (as vLLM's multimodal hashes do) and never
two different ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import wave
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


def flatten(messages: list[dict[str, Any]], cost: MediaCost) -> tuple[list[dict[str, Any]], list[int], int]:
    """The messages with each content list made its text, the media's placeholder ids, and how many media."""
    out, ids, items = [], [], 0
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
                items += 1
            elif kind == "input_audio":
                raw = (part.get("input_audio") or {}).get("data", "")
                try:
                    data = base64.b64decode(raw, validate=True)
                    with wave.open(io.BytesIO(data)) as w:
                        seconds = w.getnframes() / w.getframerate()
                except (binascii.Error, ValueError, wave.Error, EOFError):
                    raise MediaError("input_audio must carry base64 WAV data") from None
                ids += _placeholders(data, max(1, math.ceil(seconds * cost.audio_tokens_per_second)))
                items += 1
            elif kind == "video_url":
                url = str((part.get("video_url") or {}).get("url", ""))
                ids += _placeholders(url.encode(), VIDEO_TOKENS)
                items += 1
            else:
                raise MediaError(f"unsupported content part type {kind!r}")
        out.append({**m, "content": "".join(texts)})
    return out, ids, items


def _image_size(data: bytes) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (UnidentifiedImageError, OSError):
        raise MediaError("image_url's data is not an image") from None
