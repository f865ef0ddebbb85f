"""What one generation request will produce, decided before it is scheduled: its prompt's tokens (the chat template
and media included), its length and finish, a tool call, its prefix-cache hit, its reasoning share, its P/D role; or
the 4xx/5xx vLLM would answer instead."""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import gevent
import orjson

from . import media
from .graded import structured
from .http import HttpError

if TYPE_CHECKING:
    from .app import Emulator

#: the words every answer cycles through (an answer of N tokens is always the same text)
WORDS = (" the", " model", " answers", " with", " tokens", " that", " stream", " back", " to", " a",
         " client", " under", " load", " while", " batches", " grow", " and", " caches", " fill", " up")
#: tokens of a tool call's arguments (the emulator's calls are short, like a real model's)
TOOL_CALL_TOKENS = 16


@dataclass
class Output:
    """What one generation request will produce, decided before it is scheduled."""

    ids: list[int]  # the prompt's token ids
    max_tokens: int
    finish: str  # "length", "stop" (stopped on its own) or "tool_calls"
    tool: str | None  # the function the answer calls
    cached: int  # prompt tokens found in the prefix cache
    reasoning: int = 0  # the first tokens are reasoning (a reasoning model's thinking), the rest the answer
    #: disaggregated prefill/decode, as vLLM's router asks (kv_transfer_params): "produce" (a prefill: its answer
    #: carries the KV's whereabouts), "consume" (a decode: the prompt's KV is pulled from the prefill, not computed)
    kv: str = ""
    answer: list[str] | None = None  # a graded item's answer, piece by piece (``graded.py``): the whole answer
    priority: int = 0  # vLLM's request priority (lower is handled earlier) under --scheduling-policy priority
    #: the prompt tokens /metrics counts when not all of ``ids``: an encoder-decoder model's (Whisper's) decoder
    #: prompt alone, where its usage adds the audio's frames too (vLLM 0.32, measured)
    decoder_tokens: int | None = None
    #: a diverge fault: from this token on (0-based) the answer parts from the one the same prompt gets alone
    diverge_at: int | None = None

    def metered(self) -> int:
        return len(self.ids) if self.decoder_tokens is None else self.decoder_tokens


def tool_to_call(body: dict) -> str | None:
    """Deterministic tool use: a named tool_choice calls that function, "required" the first tool, "auto" (the
    default) the first tool when the conversation ends with a user turn and answers in text after a tool's
    result; "none" never calls."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or "") or None
    first = (tools[0].get("function") or {}).get("name") if isinstance(tools[0], dict) else None
    if choice == "required":
        return first
    if choice == "auto":
        messages = body.get("messages") or [{}]
        return first if isinstance(messages[-1], dict) and messages[-1].get("role") == "user" else None
    return None


def tool_pieces(name: str, n: int) -> Iterator[str]:
    """The arguments of a call, in ``n`` pieces (one per token) that concatenate to valid JSON."""
    words = [w.strip() for w in itertools.islice(itertools.cycle(WORDS), max(0, n - 2))]
    if n <= 1:
        yield orjson.dumps({"query": name}).decode()
        return
    yield '{"query": "'
    for w in words:
        yield w + " "
    yield '"}'


def markup_pieces(name: str, n: int) -> Iterator[str]:
    """A call the parser did not take, as the content a hermes-style model writes (``<tool_call>{...}</tool_call>``),
    in ``n`` pieces."""
    pieces = list(tool_pieces(name, n))
    pieces[0] = f'<tool_call>{{"name": "{name}", "arguments": ' + pieces[0]
    pieces[-1] += "}</tool_call>"
    return iter(pieces)


def tool_call_id() -> str:
    """Nine letters and digits: the id shape Mistral's tokenizer accepts back in the history (vLLM's too)."""
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))


def prompt_ids(emu: Emulator, chat: bool, body: dict) -> list[int]:
    """The prompt's token ids, as vLLM would tokenize it (chat template included)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HttpError(400, "messages must be a non-empty list", "BadRequestError", "messages")
        try:  # images, audio, video: placeholder tokens after the text, as a multimodal model charges them
            messages, media_ids, keys = media.flatten(messages, emu.media_cost)
        except media.MediaError as exc:
            raise HttpError(400, str(exc), "BadRequestError", "messages") from None
        items = len(keys)
        if items:
            emu.metrics.l(emu.metrics.mm_queries).inc(items)
            emu.metrics.l(emu.metrics.mm_hits).inc(emu.mm_cache.query(keys))
        if items and emu.media_cost.encode_seconds > 0:
            gevent.sleep(items * emu.media_cost.encode_seconds)  # the encoder's time, before the prefill
        if emu.tok is None:
            return [hash(w) & 0xFFFF for m in messages for w in str(m.get("content", "")).split()] + media_ids
        try:
            return list(emu.history.encode_chat(messages, body.get("tools"))) + media_ids
        except Exception as exc:  # a template that rejects the messages: vLLM answers 400 too
            raise HttpError(400, f"cannot apply the chat template: {str(exc)[:200]}", "BadRequestError",
                            "messages") from None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    if not isinstance(prompt, str) or not prompt:
        raise HttpError(400, "prompt must be a non-empty string or token list", "BadRequestError", "prompt")
    if emu.tok is None:
        return [hash(w) & 0xFFFF for w in prompt.split()]
    return emu.tok.encode(prompt, add_special_tokens=True)


def plan(emu: Emulator, chat: bool, body: dict, fault: str | None = None,
         ids: list[int] | None = None, cache: bool = True) -> tuple[str, Output]:
    """What a generation request will produce (its model and Output), or the HttpError vLLM would answer.
    ``ids``: the prompt's token ids when the caller tokenized it (the Responses API); ``cache`` False: the model
    has no prefix cache (vLLM disables it for encoder-decoder models)."""
    model = emu.model_of(body)
    ids = prompt_ids(emu, chat, body) if ids is None else ids
    prompt_tokens = len(ids)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    finish = "length"
    tool = tool_to_call(body) if chat else None
    if max_tokens is None:
        max_tokens = 16 if not chat else max(1, emu.max_model_len - prompt_tokens)
        if emu.eos_after and max_tokens > emu.eos_after:  # the "model" stops on its own
            max_tokens, finish = emu.eos_after, "stop"
    if tool is not None:  # a call's arguments are short, whatever the length asked
        max_tokens, finish = min(max_tokens, TOOL_CALL_TOKENS), "tool_calls"
    answer = emu.graded.answer(body) if chat and tool is None and emu.graded is not None else None
    answer = structured(body) if answer is None and tool is None else answer  # guided decoding: valid JSON
    if answer is not None and isinstance(max_tokens, int):  # a graded item: its answer, then the model stops
        max_tokens, finish = min(max_tokens, len(answer)), "stop"
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens}.", "BadRequestError", "max_tokens")
    if prompt_tokens + max_tokens > emu.max_model_len:
        raise HttpError(400, (
            f"This model's maximum context length is {emu.max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."), "BadRequestError")
    if not emu.engine.fits(prompt_tokens + max_tokens):
        raise HttpError(400, f"{prompt_tokens + max_tokens} tokens do not fit the KV cache of "
                             f"{emu.engine.cfg.num_gpu_blocks} blocks of {emu.engine.cfg.block_size}", "BadRequestError")
    emu.faults.raise_overload(fault)
    if emu.lora_slots is not None and model in emu.loras:  # an adapter beyond the loaded ones: its load first
        wait = emu.lora_slots.use(model)
        if wait:
            gevent.sleep(wait)
    cached = 0
    if cache:
        m = emu.metrics
        m.l(m.prefix_queries).inc(prompt_tokens)
        hits = emu.prefix_cache.query(ids)
        m.l(m.prefix_hits).inc(hits.local)
        if emu.prefix_cache.offload_capacity:  # vLLM asks its connector for what the GPU did not hold
            m.l(m.external_queries).inc(prompt_tokens - hits.local)
            m.l(m.external_hits).inc(hits.offloaded)
        cached = hits.total
    if fault == "overrun":  # a broken server: it streams 100 times the tokens asked
        max_tokens = max_tokens * 100
    thinking = 0
    if chat and tool is None and answer is None and emu.reasoning is not None:  # within max_tokens, as a real model's thinking
        thinking = min(max_tokens, emu.reasoning.sample(emu.reasoning_rng))
    kv_params = body.get("kv_transfer_params")
    kv = ("" if not isinstance(kv_params, dict) else "produce" if kv_params.get("do_remote_decode")
          else "consume" if kv_params.get("do_remote_prefill") else "")
    priority = body.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise HttpError(400, f"priority must be an integer, got {priority!r}", "BadRequestError", "priority")
    diverge_at = None
    if fault == "diverge" and tool is None and answer is None and max_tokens > emu.faults.diverge_at:
        diverge_at = emu.faults.diverge_at  # the answer reaches the token it parts at: counted, the check's truth
        emu.metrics.l(emu.metrics.diverged).inc()
    return model, Output(ids, max_tokens, finish, tool, cached, thinking, kv, answer, priority,
                         diverge_at=diverge_at)


def answer_words(diverge_at: int | None = None) -> Iterator[str]:
    """An answer's words, one per token: the cycle of ``WORDS`` (every answer of N tokens the same text), or with
    ``diverge_at`` the same up to that token and from there on each word one further along the cycle."""
    if diverge_at is None:
        return itertools.cycle(WORDS)
    return (WORDS[(i + (i >= diverge_at)) % len(WORDS)] for i in itertools.count())


def usage(emu: Emulator, out: Output, n: int) -> dict:
    """The usage object of an answer of ``n`` tokens so far (cached and reasoning tokens where vLLM gives them)."""
    prompt_tokens = len(out.ids)
    got: dict = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n}
    if emu.prompt_tokens_details:
        got["prompt_tokens_details"] = {"cached_tokens": out.cached}
    if out.reasoning:
        got["completion_tokens_details"] = {"reasoning_tokens": min(n, out.reasoning)}
    return got
