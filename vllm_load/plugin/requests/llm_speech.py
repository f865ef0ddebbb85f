"""Speech to text for ``self.llm`` (``transcribe``) and for the built-in ``TranscriptionUser``: a clip (generated and
unique, or a file), counted as vLLM counts a Whisper request, sent through the one request path (``LLM.send``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_load.client.apis.audio import count_input, transcription_request
from vllm_load.client.reply import Reply
from vllm_load.client.stream import ReadyRequest
from vllm_load.workload.media import wav_seconds

#: a built-in user's clip when --audio-seconds is not given
DEFAULT_CLIP_SECONDS = 5.0


def workload_request(src: Any, api: str) -> ReadyRequest:
    """The run's next clip to text, in the prompt thread: --audio-from's next file, else a unique generated clip of
    --audio-seconds (5 s by default); the answer capped at --output-tokens."""
    media = src.media()  # chat.py's maker too: a second one of the same source made the same clips
    if media.audio_files is not None:
        clip, filename = media.audio_files.clip()
        seconds = wav_seconds(clip)
    else:
        seconds = float(getattr(src.opts, "audio_seconds", 0.0) or 0.0) or DEFAULT_CLIP_SECONDS
        clip, filename = media.maker.audio_bytes(seconds), "clip.wav"
    model, group = src.next_model()
    return transcription_request(model, clip, seconds, count_input(src.tokenizer.encode, seconds, api),
                                 src.output_spec.sample(src.rng), api=api, filename=filename, defaults=src.defaults,
                                 group=group)


class SpeechCalls:
    """A part of ``LLM`` (``plugin/requests/llm.py``): it needs ``_source()`` and ``send()`` from there."""

    _source: Any
    send: Any

    def transcribe(self, audio: bytes | str | Path | None = None, *, seconds: float | None = None,
                   language: str = "en", prompt: str = "", max_tokens: int | None = None, translate: bool = False,
                   stream: bool = True, name: str | None = None, headers: dict[str, str] | None = None,
                   **form: Any) -> Reply:
        """One clip to text (``/v1/audio/transcriptions``; ``translate=True``: ``/translations``): ``audio`` is a
        file's path or its bytes (WAV measures itself; another format needs ``seconds``), or None for a unique
        generated clip of ``seconds``. Streamed (time to the first text, every gap) or, with ``stream=False``,
        answered whole (its E2E). Input tokens are checked as vLLM counts a Whisper request; the real-time factor
        is the E2E over the clip's length. ``form``: more form fields (``temperature``, ``seed`` ...)."""
        src = self._source()
        filename = "clip.wav"
        if audio is None:
            if not seconds or seconds <= 0:
                raise ValueError("self.llm.transcribe(): give audio (a path or bytes) or seconds= for a generated clip")
            audio = src.media_part("clip", seconds)
        elif isinstance(audio, (str, Path)):
            filename, audio = Path(audio).name, src.offload(Path(audio).read_bytes)
        if not isinstance(audio, (bytes, bytearray)) or not audio:
            raise TypeError("self.llm.transcribe(audio): give a path, non-empty bytes, or None with seconds=")
        seconds = wav_seconds(bytes(audio)) or seconds
        api = "translation" if translate else "transcription"
        tokens = src.offload(count_input, src.tokenizer.encode, seconds, api, language, prompt)
        model, group = (form.pop("model"), None) if "model" in form else src.next_model()
        ready = transcription_request(model, bytes(audio), seconds, tokens, max_tokens, api=api,
                                      language=language, prompt=prompt, stream=stream, filename=filename,
                                      defaults=src.defaults, extra=form, group=group)
        return self.send(ready, name=name, headers=headers)

