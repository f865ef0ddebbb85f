"""``self.llm``'s media: unique images, clips and videos as chat content parts, made in the helper thread (never on the
event loop), no two calls' bytes the same (so neither the server's multimodal cache nor its prefix cache shares
them)."""

from __future__ import annotations

from typing import Any


class MediaCalls:
    """A part of ``LLM`` (``plugin/requests/llm.py``): it needs ``_source()`` from there."""

    _source: Any

    def image(self, width: int = 512, height: int = 512) -> dict[str, Any]:
        """A unique JPEG image as a chat content part (``{"type": "image_url", "image_url": {"url": data URL}}``):
        put it in a message's content list beside a text part. Made in a helper thread, never on the event loop;
        no two calls give the same bytes, so the server's multimodal and prefix caches cannot share it."""
        if not (isinstance(width, int) and isinstance(height, int)) or width < 1 or height < 1:
            raise ValueError(f"self.llm.image(width={width!r}, height={height!r}): give positive ints")
        return self._source().media_part("image", width, height)

    def audio(self, seconds: float = 1.0) -> dict[str, Any]:
        """A unique 16 kHz WAV clip as a chat content part (``{"type": "input_audio", …}``), as ``image``."""
        if not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"self.llm.audio(seconds={seconds!r}): give a positive number of seconds")
        return self._source().media_part("audio", float(seconds))

    def video(self, frames: int = 8, width: int = 224, height: int = 224) -> dict[str, Any]:
        """A unique Motion-JPEG AVI of ``frames`` frames as a chat content part (``{"type": "video_url",
        "video_url": {"url": data URL}}``), as ``image``: what vLLM reads with OpenCV, no FFmpeg needed."""
        if not all(isinstance(v, int) and v >= 1 for v in (frames, width, height)):
            raise ValueError(f"self.llm.video(frames={frames!r}, width={width!r}, height={height!r}): give positive "
                             "ints")
        return self._source().media_part("video", frames, width, height)
