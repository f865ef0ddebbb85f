"""Speech to text (``POST /v1/audio/transcriptions`` and ``/translations``, OpenAI's audio API as vLLM 0.32 serves it
in ``entrypoints/speech_to_text/``): a multipart form carrying one clip, streamed back as ``transcription.chunk``
events (``choices[0].delta.content``, a usage chunk with ``stream_include_usage``, then ``[DONE]``): the chat
stream's shape, so ``StreamState`` reads it and it is timed like chat (time to the first text, every gap).

What vLLM counts for a Whisper-style model, and so what a request is checked against: the decoder's prompt
(``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``, after ``<|prev|>`` and the request's ``prompt``
when there is one) plus one token per log-mel frame of the audio (``get_num_audio_tokens``: ceil(seconds x 16,000
/ hop 160) = 100 a second). The form has no ``ignore_eos``: the answer is at most ``max_completion_tokens`` long,
checked against the usage, never forced. A clip's seconds travel with the request: the real-time factor is the
request's E2E over them.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Callable

from vllm_load.client.stream import BodyDefaults, ReadyRequest

#: log-mel frames a second, each one token of vLLM's prompt count (16 kHz audio, Whisper's hop of 160 samples)
FRAMES_PER_SECOND = 100.0
#: one boundary per process: the Content-Type of every form is the same, so a transport builds its request's
#: head once (96 random bits: no clip carries it by chance)
BOUNDARY = "vllm-load-" + secrets.token_hex(12)
#: the two routes: the clip's own language, or English
TASKS = {"transcription": "transcribe", "translation": "translate"}


def decoder_prompt(language: str, task: str, prompt: str = "") -> str:
    """The decoder's text vLLM builds for Whisper (``WhisperForConditionalGeneration.get_generation_prompt``)."""
    return (f"<|prev|>{prompt}" if prompt else "") + f"<|startoftranscript|><|{language}|><|{task}|><|notimestamps|>"


def audio_tokens(seconds: float) -> int:
    """The clip's share of the prompt count: one token per log-mel frame."""
    return math.ceil(seconds * FRAMES_PER_SECOND - 1e-9)


def form(fields: dict[str, Any], audio: bytes, filename: str) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body (its bytes and its Content-Type): the text fields, then the clip."""
    out = bytearray()
    for key, value in fields.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{text}\r\n'.encode()
    kind = "audio/wav" if filename.lower().endswith(".wav") else "application/octet-stream"
    out += (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: {kind}\r\n\r\n").encode()
    out += audio + f"\r\n--{BOUNDARY}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={BOUNDARY}"


def transcription_request(model: str, audio: bytes, seconds: float | None, input_tokens: int | None,
                          max_tokens: int | None, *,
                          api: str = "transcription", language: str = "en", prompt: str = "", stream: bool = True,
                          filename: str = "clip.wav", defaults: BodyDefaults = BodyDefaults(),
                          extra: dict[str, Any] | None = None, group: str | None = None) -> ReadyRequest:
    """One clip to text: ``seconds`` long (None: unknown, no real-time factor), counted by the caller as
    ``input_tokens`` (None: the server's count stands unchecked); ``max_tokens`` caps the answer (None: the
    server's cap). ``extra``: more form fields (``temperature``, ``seed``...)."""
    if api not in TASKS:
        raise ValueError(f"speech to text is {' or '.join(TASKS)}, not {api!r}")
    fields: dict[str, Any] = {"model": model, "language": language, "temperature": defaults.temperature,
                              "response_format": "json"}
    if max_tokens is not None:
        fields["max_completion_tokens"] = max_tokens
    if prompt:
        fields["prompt"] = prompt
    if stream:
        fields.update(stream=True, stream_include_usage=True)
        if defaults.continuous_usage:
            fields["stream_continuous_usage_stats"] = True
    fields.update({k: v for k, v in defaults.extra if not isinstance(v, (dict, list))})
    fields.update(extra or {})
    body, content_type = form(fields, audio, filename)
    return ReadyRequest(api, body, input_tokens, None, group, max_tokens=max_tokens, content_type=content_type,
                        audio_seconds=seconds, streamed=stream)


def count_input(encode: Callable[[str, bool], list[int]], seconds: float | None, api: str, language: str = "en",
                prompt: str = "") -> int | None:
    """The prompt tokens vLLM counts for a Whisper-style model: the decoder's text under the run's tokenizer,
    then the clip's frames (None when the clip's length is unknown: a file only a decoder could measure)."""
    if seconds is None:
        return None
    return len(encode(decoder_prompt(language, TASKS[api], prompt), False)) + audio_tokens(seconds)
