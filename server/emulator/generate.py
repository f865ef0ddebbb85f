"""Generation: a request's answer as vLLM 0.32 writes it, whole (``complete``) or as SSE chunks (``stream``: role,
content or reasoning deltas, tool-call deltas, continuous usage, the usage event with per-request metrics, [DONE]),
paced by the engine's schedule; its counters and histograms in /metrics, its span, its timing-log line; the faults
that strike mid-stream."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Iterable

import gevent
import orjson

from .http import DropConnection, Start, reply
from .pd import kv_transfer_params, pull_kv
from .plan import Output, answer_words, markup_pieces, tool_call_id, tool_pieces, usage

if TYPE_CHECKING:
    from .app import Emulator

VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VERSION}-emulator"
#: a chunk produced this long after its schedule's due time counts as late: the emulator itself fell behind
LATE_S = 0.010


def observe_finish(emu: Emulator, prompt_tokens: int, out: int, ttft: float, e2e: float, queue: float = 0.0,
                   finish: str = "length") -> None:
    m = emu.metrics
    m.l(m.prompt_tokens).inc(prompt_tokens)
    m.success.labels(finished_reason="stop" if finish == "tool_calls" else finish, **m.labels).inc()
    m.l(m.e2e).observe(e2e)
    m.l(m.queue).observe(queue)
    m.l(m.prefill).observe(max(0.0, ttft - queue))
    m.l(m.decode).observe(max(0.0, e2e - ttft))
    m.l(m.req_prompt).observe(prompt_tokens)
    m.l(m.req_generation).observe(out)


def paced(emu: Emulator, out: Output) -> Iterable[int]:
    """The answer's tokens on the engine's schedule, a count per emission, observed as vLLM's histograms (and the
    request's end once they are all out): the named-event APIs' pace (``responses``, ``messages``)."""
    m = emu.metrics
    n, ttft, prev, queue = 0, 0.0, 0.0, 0.0
    for em in emu.engine.generate(len(out.ids), out.max_tokens, out.cached, priority=out.priority):
        if n == 0:
            ttft, queue = em.offset, em.queue_time
            m.l(m.ttft).observe(ttft)
        else:
            for _ in range(em.tokens):
                m.l(m.itl).observe((em.offset - prev) / em.tokens)
        prev = em.offset
        m.l(m.generation_tokens).inc(em.tokens)
        n += em.tokens
        yield em.tokens
    observe_finish(emu, out.metered(), n, ttft, prev, queue, out.finish)


def complete(emu: Emulator, start_response: Start, chat: bool, model: str, out: Output,
             trace: str | None = None) -> list[bytes]:
    words = answer_words(out.diverge_at)
    prompt_tokens, max_tokens = len(out.ids), out.max_tokens
    text, ttft, last = [], 0.0, 0.0
    m, first, queue = emu.metrics, True, 0.0
    pieces = tool_pieces(out.tool, max_tokens) if out.tool else iter(out.answer) if out.answer else None
    shift = pull_kv(emu, out)
    for em in emu.engine.generate(prompt_tokens, max_tokens, out.cached, remote=out.kv == "consume",
                                 priority=out.priority):
        offset = em.offset + shift  # after its arrival here, a decode's KV pull included
        if first:
            ttft, queue, first = offset, em.queue_time, False
            m.l(m.ttft).observe(ttft)
        else:
            for _ in range(em.tokens):
                m.l(m.itl).observe((offset - last) / em.tokens)
        last = offset
        text.extend(next(pieces) if pieces else next(words) for _ in range(em.tokens))
    m.l(m.generation_tokens).inc(max_tokens)
    observe_finish(emu, prompt_tokens, max_tokens, ttft, last, queue, out.finish)
    used = usage(emu, out, max_tokens)
    rid, created = secrets.token_hex(8), int(time.time())
    export_span(emu, trace, f"{'chatcmpl' if chat else 'cmpl'}-{rid}", queue, ttft, last, max_tokens, prompt_tokens)
    answer = "".join(text)
    emu.cache_answer(out, answer)
    if chat:
        message: dict = {"role": "assistant", "content": answer}
        if out.reasoning:
            message = {"role": "assistant", "content": "".join(text[out.reasoning:]) or None,
                       "reasoning": "".join(text[:out.reasoning])}
        if out.tool:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": tool_call_id(), "type": "function", "function": {"name": out.tool, "arguments": answer}}]}
        body = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": message,
                             "logprobs": None, "finish_reason": out.finish, "stop_reason": None}], "usage": used}
    else:
        body = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": answer, "logprobs": None, "finish_reason": out.finish,
                             "stop_reason": None}], "usage": used}
    if out.kv == "produce":  # a prefill instance: where its decode instance pulls the KV from
        body["kv_transfer_params"] = kv_transfer_params(emu, out)
    return reply(start_response, 200, orjson.dumps(body))


def export_span(emu: Emulator, trace: str | None, rid: str, queue: float, ttft: float, last: float,
                tokens: int, prompt_tokens: int) -> None:
    """The request's span, as vLLM's --otlp-traces-endpoint sends one (a request that carried a traceparent)."""
    if trace is None or emu.spans is None:
        return
    times = per_request_metrics(queue, ttft, last, tokens)
    now = time.time_ns()
    emu.spans.add({"trace_id": trace, "span_id": secrets.token_hex(8), "request_id": rid, "queue": queue,
                   "prefill": times["time_to_first_token_ms"] / 1000, "decode": times["generation_time_ms"] / 1000,
                   "ttft": ttft, "e2e": last, "prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                   "start_ns": now - int(last * 1e9), "end_ns": now})


def stream(emu: Emulator, chat: bool, model: str, out_spec: Output, include_usage: bool,
           continuous: bool, fault: str | None = None, received: float = 0.0,
           trace: str | None = None, head: dict | None = None) -> Iterable[bytes]:
    """The answer's events; a client that goes away mid-answer (the server closes the stream) is counted as vLLM
    counts it: ``vllm:request_success_total{finished_reason="abort"}``, its sequence freed. ``head``: the chunks'
    id and object when they are not chat's or a completion's (speech to text's: chat's deltas, no role chunk)."""
    try:
        yield from _stream(emu, chat, model, out_spec, include_usage, continuous, fault, received, trace, head)
    except GeneratorExit:
        emu.metrics.success.labels(finished_reason="abort", **emu.metrics.labels).inc()
        raise


def _stream(emu: Emulator, chat: bool, model: str, out_spec: Output, include_usage: bool,
            continuous: bool, fault: str | None, received: float, trace: str | None,
            own_head: dict | None = None) -> Iterable[bytes]:
    m = emu.metrics
    log = emu.timing_log
    due: list[float] = []
    sent: list[float] = []  # when each token-bearing chunk had been written to the socket
    perf = time.perf_counter
    arrival = 0.0  # when the engine took the request, seconds after it was received
    rid, created = secrets.token_hex(8), int(time.time())
    head = (dict(own_head) if own_head else {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk"} if chat
            else {"id": f"cmpl-{rid}", "object": "text_completion"})
    head.update(created=created, model=model)
    words = answer_words(out_spec.diverge_at)
    prompt_tokens, max_tokens, cached = len(out_spec.ids), out_spec.max_tokens, out_spec.cached
    tool = out_spec.tool
    pieces = tool_pieces(tool, max_tokens) if tool else iter(out_spec.answer) if out_spec.answer else None
    broken = emu.faults.bad_tool() if fault == "bad-tool" and tool else None  # how this call is broken, if it is
    if broken is not None:
        m.bad_tool_calls.labels(kind=broken, **m.labels).inc()
        if broken == "unknown_tool":
            tool = tool + "_unoffered"
        elif broken == "arguments_not_json":  # the call's closing brace never comes (its piece is not empty)
            pieces = (p[:-1] if p.endswith('"}') else p for p in tool_pieces(tool, max_tokens))
        elif broken == "tool_markup_in_content":  # the answer is text: the call's markup, no tool call
            pieces, tool = markup_pieces(tool, max_tokens), None
    beside = {"markup_unbalanced": "<think>", "special_token_in_content": eos_text(emu)}.get(broken or "")
    answer: list[str] = []
    out, ttft, prev, queue = 0, 0.0, 0.0, 0.0

    def usage_of(n: int) -> dict:
        return usage(emu, out_spec, n)

    def event(obj: dict) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    if fault == "slow-headers":
        gevent.sleep(emu.faults.stall_seconds)
    fault_at = max(1, max_tokens // 2)  # mid-stream faults strike after half the tokens
    shift = pull_kv(emu, out_spec)  # a decode instance's KV transfer: before its first token
    for em in emu.engine.generate(prompt_tokens, max_tokens, cached, remote=out_spec.kv == "consume",
                                 priority=out_spec.priority):
        if out >= fault_at and fault in ("drop", "malformed", "error", "stall", "endless"):
            if fault == "drop":
                raise DropConnection()
            if fault == "endless":  # bytes without a line end, 24 MiB of them (past the client's 16), then closed
                chunk = b"a" * 65536
                for _ in range(384):
                    yield chunk
                raise DropConnection()
            if fault == "malformed":
                yield b'data: {"id": "broken\n\n'
            elif fault == "error":
                yield event({"error": {"message": f"injected fault: engine error in request {rid}",
                                       "type": "InternalServerError",
                                       "param": None, "code": 500}})
                yield b"data: [DONE]\n\n"
                return
            else:
                gevent.sleep(emu.faults.stall_seconds)
            fault = None
        parts = [next(pieces) if pieces else next(words) for _ in range(em.tokens)]
        text = "".join(parts)
        answer.append(text)
        m.l(m.generation_tokens).inc(em.tokens)
        offset = em.offset + shift  # after its arrival here, a decode's KV pull included
        if out == 0:
            ttft, queue = offset, em.queue_time
            arrival = em.at - em.offset - received  # the engine's own arrival, not one re-read later
            m.l(m.ttft).observe(ttft)
            if chat and own_head is None:
                role = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]}
                if continuous:
                    role["usage"] = usage_of(0)
                role.update(prompt_token_ids=None, prompt_text=None)
                yield event(role)
        else:
            gap = (offset - prev) / em.tokens
            for _ in range(em.tokens):
                m.l(m.itl).observe(gap)
        prev = offset
        if em.due is not None:  # how late this process wrote it against its own schedule (a starved emulator)
            emu.emitted += 1
            if em.offset - em.due > LATE_S:
                emu.late += 1
        # a reasoning model's chunk is its thinking, its answer, or (at the switch) two chunks: one of each
        thinking = min(em.tokens, max(0, out_spec.reasoning - out))
        for n, kind, piece in ((thinking, "reasoning", "".join(parts[:thinking])),
                               (em.tokens - thinking, "content", "".join(parts[thinking:]))):
            if not n:
                continue
            out += n
            last = out >= max_tokens
            # transformers serve: the finish_reason comes alone, with the usage, in a chunk of its own
            finish = out_spec.finish if last and emu.stream_style != "transformers" else None
            if tool:  # vLLM's shape: the first delta names the call (id, type, name), the next ones add arguments
                call: dict = {"index": 0, "function": {"arguments": piece}}
                if out == n:
                    call = {"id": tool_call_id(), "type": "function", "index": 0,
                            "function": {"name": tool, "arguments": piece}}
                calls = [call, {"index": 0, "function": {"arguments": ""}}] if broken == "empty_delta" and out == n \
                    else [call]  # an empty call delta after the first (vLLM #54701)
                choice: dict = {"index": 0, "delta": {"tool_calls": calls}, "logprobs": None,
                                "finish_reason": finish}
                if beside and out == n:  # the call whole, broken text beside it in its first delta
                    choice["delta"]["content"] = beside
            elif chat:
                choice = {"index": 0, "delta": {kind: piece}, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
            choice["stop_reason"] = None
            if not chat:
                choice["prompt_token_ids"] = None
            choice["token_ids"] = None
            chunk = {**head, "choices": [choice]}
            if continuous:
                chunk["usage"] = usage_of(out)
            yield event(chunk)
        if log is not None:  # resumed only once the server has written the chunk
            sent.append(perf() - received)
            due.append(em.offset if em.due is None else em.due)
    if emu.stream_style == "transformers":  # its last chunk: the finish_reason and the usage, no [DONE]
        yield event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": out_spec.finish}],
                     "usage": usage_of(out)})
    if include_usage:
        last: dict = {**head, "choices": [], "usage": usage_of(out), "system_fingerprint": FINGERPRINT}
        if emu.per_request_metrics:  # vLLM's --enable-per-request-metrics: its own times of this request
            last["metrics"] = per_request_metrics(queue, ttft, prev, out)
        yield event(last)
    observe_finish(emu, out_spec.metered(), out, ttft, prev, queue, out_spec.finish)
    export_span(emu, trace, head["id"], queue, ttft, prev, out, prompt_tokens)
    if emu.stream_style == "vllm":  # the other servers end the stream after the finish_reason
        yield b"data: [DONE]\n\n"
    if log is not None:  # resumed once the stream's last event had been written: its end, for the E2E
        log.write(orjson.dumps({"id": head["id"], "arrival": round(arrival, 7),
                                "due": [round(arrival + d, 7) for d in due],
                                "sent": [round(x, 7) for x in sent],
                                "done": round(perf() - received, 7)}).decode() + "\n")
    emu.cache_answer(out_spec, "".join(answer))


def eos_text(emu: Emulator) -> str:
    """The tokenizer's end-of-sequence token as text (``</s>``): a special token no answer's content should hold."""
    return str(getattr(getattr(emu.tok, "hf", None), "eos_token", None) or "</s>")


def per_request_metrics(queue: float, ttft: float, last: float, tokens: int) -> dict:
    """vLLM 0.32's per-request metrics from this emulator's own times (seconds after it received the request):
    queued to scheduled, scheduled to the first token, the first token to the last."""
    prefill, generation = max(0.0, ttft - queue), max(0.0, last - ttft)
    return {"time_to_first_token_ms": prefill * 1000, "generation_time_ms": generation * 1000,
            "queue_time_ms": queue * 1000, "mean_itl_ms": generation * 1000 / (tokens - 1) if tokens > 1 else None,
            "tokens_per_second": tokens / (last - queue) if last > queue else None}
