"""``POST /v1/audio/transcriptions`` and ``/translations`` as vLLM 0.32 serves them for a Whisper-style model
(``vllm/entrypoints/speech_to_text/``): a multipart form with the clip in ``file``; the prompt vLLM counts is the
decoder's text (``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``, after ``<|prev|>`` and the form's
``prompt``) plus one token per log-mel frame (100 a second: 16 kHz, hop 160), where ``/metrics``'
``prompt_tokens`` counts the decoder's alone, and no prefix cache (vLLM disables it for encoder-decoder models;
both measured on vLLM 0.32 with a tiny Whisper); the answer is at most
``max_completion_tokens`` long. Streamed as ``transcription.chunk`` events (the chat stream's shape, no role
chunk), a usage chunk with ``stream_include_usage``, then ``[DONE]``; whole: ``{"text", "usage": {"type":
"duration", "seconds"}}``. The emulator reads WAV only (vLLM decodes more formats with FFmpeg)."""

from __future__ import annotations

import itertools
import math
import secrets
from email.parser import BytesParser
from email.policy import HTTP
from typing import TYPE_CHECKING, Iterable

import orjson

from .generate import paced, stream
from .http import HttpError, Start, reply
from .media import MediaError, _placeholders, wav_seconds
from .plan import WORDS, plan

if TYPE_CHECKING:
    from .app import Emulator

FRAMES_PER_SECOND = 100.0  # the prompt's audio tokens: log-mel frames of 10 ms
TASKS = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
CHUNKS = {"transcribe": "transcription.chunk", "translate": "translation.chunk"}
MAX_FORM_BYTES = 64 << 20  # vLLM refuses uploads past VLLM_MAX_AUDIO_CLIP_FILESIZE_MB (25 MB by default)


def read_form(environ: dict) -> tuple[dict[str, str], bytes]:
    """The form's text fields and the clip's bytes (400 for a body that is not a form with a file)."""
    if environ.get("REQUEST_METHOD", "GET") != "POST":
        raise HttpError(405, "Method Not Allowed", "BadRequestError")
    kind = environ.get("CONTENT_TYPE", "")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if not kind.startswith("multipart/form-data") or not 0 < length <= MAX_FORM_BYTES:
        raise HttpError(400, "speech to text takes a multipart/form-data body with the audio in `file`",
                        "BadRequestError", "file")
    raw = environ["wsgi.input"].read(length)
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + kind.encode() + b"\r\n\r\n" + raw)
    fields: dict[str, str] = {}
    audio = None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file":
            audio = payload
        elif isinstance(name, str):
            fields[name] = payload.decode("utf-8", "replace")
    if not audio:
        raise HttpError(400, "Field required: file", "BadRequestError", "file")
    return fields, audio


def seconds_of(audio: bytes) -> float:
    """A WAV clip's length (400 for another format)."""
    try:
        return wav_seconds(audio, "the emulator reads WAV audio only (vLLM decodes more formats)")
    except MediaError as exc:
        raise HttpError(400, str(exc), "BadRequestError", "file") from None


def prompt_ids(emu: Emulator, fields: dict[str, str], audio: bytes, seconds: float,
               task: str) -> tuple[list[int], list[int]]:
    """The prompt as vLLM's usage counts it: the decoder's tokens, and one per log-mel frame of the clip (its
    /metrics counts the decoder's alone)."""
    language = fields.get("language") or "en"
    text = (f"<|prev|>{fields['prompt']}" if fields.get("prompt") else "") + \
        f"<|startoftranscript|><|{language}|><|{task}|><|notimestamps|>"
    decoder = (emu.tok.encode(text, add_special_tokens=False) if emu.tok is not None
               else [hash(w) & 0xFFFF for w in text.split("|")])
    return decoder, _placeholders(audio, math.ceil(seconds * FRAMES_PER_SECOND - 1e-9))


def flag(fields: dict[str, str], name: str) -> bool:
    return fields.get(name, "").strip().lower() in ("true", "1", "yes")


def max_tokens(fields: dict[str, str]) -> int | None:
    value = fields.get("max_completion_tokens")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise HttpError(400, f"max_completion_tokens must be an integer, got {value!r}", "BadRequestError",
                        "max_completion_tokens") from None


def serve(emu: Emulator, environ: dict, start_response: Start, task: str) -> Iterable[bytes]:
    """One clip to text: planned as a completion of the prompt vLLM counts, streamed or answered whole."""
    fields, clip = read_form(environ)
    emu.log_request(environ, fields)
    seconds = seconds_of(clip)  # once: the prompt's frames and a whole answer's usage
    decoder, frames = prompt_ids(emu, fields, clip, seconds, task)
    ids = decoder + frames
    body = {"model": fields.get("model") or emu.served[0], "prompt": ids, "max_tokens": max_tokens(fields)}
    model, out = plan(emu, False, body, emu.faults.pick(environ, emu.engine.running), ids, cache=False)  # no prefix cache, as vLLM's
    out.decoder_tokens = len(decoder)
    if not flag(fields, "stream"):
        words = itertools.cycle(WORDS)
        text = "".join(next(words) for _ in range(sum(paced(emu, out))))
        usage = {"type": "duration", "seconds": math.ceil(seconds)}
        return reply(start_response, 200, orjson.dumps({"text": text, "usage": usage}))
    start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")])
    usage = flag(fields, "stream_include_usage")
    return stream(emu, True, model, out, usage, usage and flag(fields, "stream_continuous_usage_stats"),
                  head={"id": f"{task}-{secrets.token_hex(8)}", "object": CHUNKS[task]})
