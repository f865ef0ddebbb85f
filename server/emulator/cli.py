"""The emulator's command line and its server: ``build`` makes the app and its gevent server from the arguments
(``serve`` runs it as ``python -m server.emulator`` does; a test or an in-process run starts it on its own hub)."""

from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass, field
from typing import IO

import gevent
from gevent.pywsgi import WSGIHandler

from . import dcgm, graded, media
from .app import REPLICA_HEADER, Emulator
from .app import __doc__ as APP_DOC
from .engine import EngineConfig, FixedScheduleEngine
from .faults import FaultPlan, parse_fault
from .http import ArrivalStampingHandler, NoDelayWSGIServer
from .lora_slots import LoraSlots
from .profiler import Profiler
from .scheduler import PROFILES, BatchingEngine, SchedulerConfig
from .spans import SpanExporter
from vllm_load.client import rxstamp


class BadArguments(ValueError):
    """An argument the emulator refuses: the message is its one line (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m server.emulator", description=(APP_DOC or "").splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; the URL is printed)")
    p.add_argument("--replica-name", default="",
                   help=f"the name every answer gives in its {REPLICA_HEADER} header (default: HOST:PORT it listens on)")
    p.add_argument("--stream-style", default="vllm", choices=["vllm", "transformers", "no-usage"],
                   help="how a stream ends, as other OpenAI servers end it: vllm (usage when asked, [DONE]); "
                        "transformers (transformers serve: the finish_reason and the usage in one last chunk with a "
                        "choice, no [DONE]); no-usage (no usage at all, no [DONE]: a proxy that strips it)")
    p.add_argument("--model", default="emulator/mistral-7b-v0.1", help="served model name")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="the model ids clients use (default: --model), as vLLM's flag; /v1/models gives --model as root")
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME",
                   help="LoRA adapters served beside the base model: listed in /v1/models, accepted as model")
    p.add_argument("--max-loras", type=int, default=0, metavar="N",
                   help="LoRA slots, as vLLM's flag: at most N adapters loaded at once, the least recently used "
                        "evicted; a request for one not loaded waits --lora-load-seconds first (0: every adapter loaded)")
    p.add_argument("--lora-load-seconds", type=float, default=0.05,
                   help="--max-loras: what loading an adapter into a slot costs the request that needs it")
    p.add_argument("--allow-runtime-lora-updating", action="store_true",
                   default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                   help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM does with "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (which turns this on too)")
    p.add_argument("--tokenizer", default="", help="tokenizer used to count prompt tokens (default: the model's)")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--profiler-config", default="", metavar="JSON",
                   help="as vLLM's: serve POST /start_profile and /stop_profile (404 without it); each profile's window "
                        "and request count go into torch_profiler_dir as JSON")
    p.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    p.add_argument("--prefill-per-token", type=float, default=0.0, help="extra TTFT seconds per prompt token")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="output tokens carried by each SSE chunk")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="draw each TTFT and ITL uniformly from value*(1 +- JITTER), seeded by --seed (0..1)")
    p.add_argument("--itl-cycle", default="", metavar="S,S,…",
                   help="token gaps cycle through these seconds instead of --itl (a GPU's uneven decode steps, e.g. "
                        "0.01,0.03,0.02,0.005,0.04); with --lockstep the global steps do")
    p.add_argument("--lockstep", action="store_true",
                   help="emit every stream's tokens together on one global ITL grid, like a batched decode step")
    p.add_argument("--timing-log", default="",
                   help="write one JSON line per stream: arrival, scheduled (due) and actual write time of each "
                        "token-bearing chunk, and when its last event had been written (done), in seconds after the "
                        "request reached the server (its kernel receive stamp): the timing benchmark's truth")
    p.add_argument("--api-key", default="", help="require this bearer token on /v1/*")
    p.add_argument("--profile", default="", choices=["", *PROFILES],
                   help="model vLLM's continuous batching with this cost profile (default: fixed --ttft/--itl schedule)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
                   help="as vLLM's: priority admits the waiting by each request's priority (lower first), then arrival")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-gpu-blocks", type=int, default=30000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-offload-blocks", type=int, default=0,
                   help="KV offloading's CPU tier behind the prefix cache, in blocks (vLLM's --kv-offloading-size): "
                        "every computed block written through, LRU; a prompt's chain continues there past its GPU "
                        "hits (vllm:external_prefix_cache_hits), and the usage's cached tokens count both")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every step time (e.g. 0.1: ten times faster)")
    p.add_argument("--metrics-naming", choices=["v1", "v0"], default="v1", help="vLLM metric names: V1 (0.32) or old V0")
    p.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between vLLM's stats log lines on stderr (0: none)")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:RATE",
                   help="inject a fault into this share of requests (500, 503, 429, drop, malformed, error, stall, "
                        "slow-headers, overrun, echo, endless, bad-tool, diverge); a request can also ask for one with "
                        "the X-Emulator-Fault header")
    p.add_argument("--faults-from", type=int, default=0, metavar="N",
                   help="draw the --fault faults only while at least N requests run, this one included (0: always)")
    p.add_argument("--diverge-at", type=int, default=8, metavar="TOKEN",
                   help="a diverge fault's answer parts from the same prompt's answer alone at this token (0-based)")
    p.add_argument("--stall-seconds", type=float, default=30.0, help="length of stall and slow-headers faults")
    p.add_argument("--retry-after", type=float, default=0.0,
                   help="503/429 faults carry this Retry-After header, in seconds (0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault and jitter draws")
    p.add_argument("--eos-after", type=int, default=64,
                   help="a request without max_tokens stops on its own (finish_reason stop) after this many tokens "
                        "(0: it runs to the context's end)")
    p.add_argument("--reasoning-tokens", default="", metavar="LENGTH",
                   help="a reasoning model: each chat answer starts with this many reasoning tokens (N, LOW-HIGH or "
                        "normal:MEAN,STD; within max_tokens), streamed in delta.reasoning as vLLM's reasoning "
                        "parsers do, and counted in usage.completion_tokens_details.reasoning_tokens")
    p.add_argument("--graded", action="append", default=[], metavar="KIND:FILE",
                   help="answer this graded set's items (vllm-load's --accuracy formats: gsm8k, mmlu, json) right at "
                        "--graded-correct of the requests, wrong otherwise (repeatable)")
    p.add_argument("--graded-correct", type=float, default=1.0, help="the share of graded items answered right")
    p.add_argument("--spec-tokens", type=int, default=0,
                   help="speculative decoding: each decode step drafts this many tokens (vLLM's "
                        "num_speculative_tokens) and yields 1 + the accepted ones; vllm:spec_decode_* counted (0: off)")
    p.add_argument("--spec-acceptance", type=float, default=0.7,
                   help="the chance that a draft position is accepted, given the positions before it were")
    p.add_argument("--dcgm", action="store_true",
                   help="serve GPU telemetry as NVIDIA's DCGM exporter does at /dcgm/metrics, from a power model: "
                        "--dcgm-idle-watts + --dcgm-watts-per-seq per running sequence (energy counted exactly)")
    p.add_argument("--dcgm-idle-watts", type=float, default=60.0)
    p.add_argument("--dcgm-watts-per-seq", type=float, default=4.0)
    p.add_argument("--owned-by", default="vllm",
                   help="/v1/models' owned_by (e.g. llamacpp: act as a server that is not vLLM, with --reject)")
    p.add_argument("--image-patch", type=int, default=28,
                   help="an image costs one prompt token per PATCHxPATCH pixels (Qwen2-VL's 28)")
    p.add_argument("--audio-tokens-per-second", type=float, default=25.0,
                   help="prompt tokens per second of input_audio (Qwen2-Audio's 25)")
    p.add_argument("--encode-seconds", type=float, default=0.005,
                   help="encoder time per image, audio clip or video, added before the prefill")
    p.add_argument("--enable-per-request-metrics", action="store_true",
                   help="a stream's last usage chunk carries its own times, as vLLM's flag: metrics "
                        "{queue_time_ms, time_to_first_token_ms (from its scheduling), generation_time_ms, mean_itl_ms, "
                        "tokens_per_second}")
    p.add_argument("--kv-transfer-latency", type=float, default=0.001,
                   help="disaggregated prefill/decode behind vLLM's router: a decode instance's KV pull takes this "
                        "(seconds) plus --kv-transfer-per-token per prompt token before its first token")
    p.add_argument("--kv-transfer-per-token", type=float, default=1e-6,
                   help="seconds per prompt token of that pull (1e-6: ~128 KB a token at ~100 GB/s)")
    p.add_argument("--otlp-traces-endpoint", default="",
                   help="export each request's llm_request span here (OTLP/HTTP protobuf), as vLLM's flag: requests "
                        "that carry a traceparent, with the emulator's own queue, prefill and decode times")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage carries prompt_tokens_details.cached_tokens (the prefix-cache hit), as vLLM's flag")
    p.add_argument("--ssl-keyfile", default="", help="serve https with this key (and --ssl-certfile), as vLLM's flags")
    p.add_argument("--ssl-certfile", default="")
    p.add_argument("--reject", default="", metavar="FIELD,…",
                   help="answer 400 to requests carrying these body fields (e.g. min_tokens,continuous_usage_stats), "
                        "like a strict OpenAI-compatible gateway")
    p.add_argument("--request-log", default="",
                   help="append every generation request's path and JSON body to this file (for tests: what a "
                        "client really sent, with its headers; credential-like header values are written as ***)")
    return p


def _engine(args: argparse.Namespace) -> FixedScheduleEngine | BatchingEngine:
    if args.profile:
        return BatchingEngine(SchedulerConfig(cost=PROFILES[args.profile], max_num_seqs=args.max_num_seqs,
                                              max_num_batched_tokens=args.max_num_batched_tokens,
                                              num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
                                              time_scale=args.time_scale, policy=args.scheduling_policy))
    cycle = _itl_cycle(args.itl_cycle)
    return FixedScheduleEngine(EngineConfig(ttft=args.ttft, itl=args.itl, prefill_per_token=args.prefill_per_token,
                                            tokens_per_chunk=args.tokens_per_chunk, jitter=args.jitter,
                                            lockstep=args.lockstep, seed=args.seed, itl_cycle=cycle,
                                            num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
                                            spec_tokens=args.spec_tokens, spec_acceptance=args.spec_acceptance))


def _itl_cycle(text: str) -> tuple[float, ...]:
    try:
        cycle = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        cycle = (-1.0,)
    if any(x <= 0 for x in cycle):
        raise BadArguments(f"--itl-cycle {text!r} must list positive seconds, e.g. 0.01,0.03")
    return cycle


def check(args: argparse.Namespace) -> None:
    """The arguments' bounds, each refused in one line (BadArguments)."""
    if not 0 <= args.port <= 65535:
        raise BadArguments(f"--port {args.port} is no TCP port: give 1-65535 (0: a free one)")
    if args.ttft < 0 or args.itl < 0 or args.tokens_per_chunk < 1 or args.max_model_len < 1:
        raise BadArguments("--ttft/--itl must be >= 0, --tokens-per-chunk and --max-model-len >= 1")
    _itl_cycle(args.itl_cycle)
    if not 0.0 <= args.jitter <= 1.0:
        raise BadArguments(f"--jitter {args.jitter} is not between 0 and 1 (a fraction of TTFT/ITL)")
    if min(args.max_num_seqs, args.max_num_batched_tokens, args.num_gpu_blocks, args.block_size) < 1 \
            or args.time_scale <= 0:
        raise BadArguments("scheduler sizes must be >= 1 and --time-scale > 0")
    if args.kv_offload_blocks < 0:
        raise BadArguments(f"--kv-offload-blocks {args.kv_offload_blocks} must be >= 0 (0: no offload tier)")
    if args.spec_tokens < 0 or not 0.0 <= args.spec_acceptance <= 1.0 or (args.spec_tokens and args.profile):
        raise BadArguments("--spec-tokens must be >= 0 and --spec-acceptance within 0..1; speculative decoding runs "
                           "on the fixed schedule (not with --profile)")


def _faults(args: argparse.Namespace) -> FaultPlan:
    try:
        faults = FaultPlan(dict(parse_fault(f) for f in args.fault), args.stall_seconds, random.Random(args.seed),
                           retry_after=args.retry_after, from_running=max(0, args.faults_from),
                           diverge_at=args.diverge_at)
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    if args.diverge_at < 0:
        raise BadArguments(f"--diverge-at {args.diverge_at}: a token position is >= 0")
    if sum(faults.rates.values()) > 1.0:
        raise BadArguments("the --fault rates add up to more than 1")
    return faults


def _app(args: argparse.Namespace, timing_log: IO[str] | None) -> Emulator:
    from vllm_load.errors import UsageError
    from vllm_load.workload.lengths import parse_length
    from vllm_load.workload.tokenizer import load_tokenizer

    faults = _faults(args)
    try:
        reasoning = parse_length(args.reasoning_tokens, "--reasoning-tokens") if args.reasoning_tokens else None
        tok = load_tokenizer(args.tokenizer or args.model)
        answers = graded.of(args)
    except UsageError as exc:
        raise BadArguments(str(exc)) from None
    engine = _engine(args)
    if args.dcgm:
        engine.power = dcgm.PowerModel(idle_w=max(0.0, args.dcgm_idle_watts), per_seq_w=max(0.0, args.dcgm_watts_per_seq))
    request_log = open(args.request_log, "a", buffering=1) if args.request_log else None  # noqa: SIM115 (lives as long as the server)
    app = Emulator(args.model, tok, args.max_model_len, engine, api_key=args.api_key, faults=faults,
                   naming=args.metrics_naming, timing_log=timing_log, request_log=request_log,
                   eos_after=max(0, args.eos_after), prompt_tokens_details=args.enable_prompt_tokens_details,
                   served_names=args.served_model_name, lora_modules=args.lora_modules,
                   reject=[f.strip() for f in args.reject.split(",") if f.strip()], reasoning=reasoning,
                   seed=args.seed, media_cost=media.MediaCost(max(1, args.image_patch),
                                                               max(0.0, args.audio_tokens_per_second),
                                                               max(0.0, args.encode_seconds)))
    app.graded = answers
    if args.max_loras > 0:
        app.lora_slots = LoraSlots(args.max_loras, max(0.0, args.lora_load_seconds), app.metrics.registry)
    app.owned_by = args.owned_by
    app.stream_style = args.stream_style
    app.per_request_metrics = args.enable_per_request_metrics
    app.kv_transfer = (max(0.0, args.kv_transfer_latency), max(0.0, args.kv_transfer_per_token))
    app.prefix_cache.offload_capacity = args.kv_offload_blocks
    app.runtime_lora = args.allow_runtime_lora_updating
    if args.profiler_config:
        try:
            app.profiler = Profiler(args.profiler_config)
        except ValueError as exc:  # json.JSONDecodeError is one
            raise BadArguments(f"--profiler-config: {exc}") from None
    if args.otlp_traces_endpoint:
        try:
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401
        except ImportError:
            raise BadArguments("--otlp-traces-endpoint needs opentelemetry-proto: pip install 'vllm-load[otel]'") \
                from None
        app.spans = SpanExporter(args.otlp_traces_endpoint, args.replica_name or "unknown_service:emulator")
    return app


@dataclass
class Served:
    """An emulator bound to its port, serving on this process's gevent hub once started."""

    app: Emulator
    server: NoDelayWSGIServer
    url: str
    log_stats: float = 0.0  # seconds between vLLM's stats lines on stderr (0: none)
    greenlets: list = field(default_factory=list)

    def start(self) -> Served:
        self.server.start()
        if self.log_stats > 0:
            self.greenlets.append(gevent.spawn(self._log_stats))
        return self

    def _log_stats(self) -> None:
        while True:
            gevent.sleep(self.log_stats)
            sys.stderr.write(self.app.stats_line(self.log_stats) + "\n")
            sys.stderr.flush()

    def stop(self) -> None:
        """Stop serving, and the greenlets it started (its stats lines, its span export); again: nothing."""
        if self.server.closed:
            return
        self.server.stop(timeout=0)
        for g in [*self.greenlets, *([self.app.spans.loop] if self.app.spans is not None else [])]:
            g.kill(block=False)
        for log in (self.app.timing_log, self.app.request_log):
            if log is not None:
                log.close()


def build(argv: list[str]) -> Served:
    """The emulator of these arguments, bound (port 0: a free one) but not yet serving; BadArguments for bad input."""
    args = build_parser().parse_args(argv)
    check(args)
    timing_log = open(args.timing_log, "a", buffering=1) if args.timing_log else None  # noqa: SIM115
    app = _app(args, timing_log)
    handler = ArrivalStampingHandler if timing_log is not None else WSGIHandler
    tls = {"keyfile": args.ssl_keyfile, "certfile": args.ssl_certfile} if args.ssl_certfile else {}
    server = NoDelayWSGIServer((args.host, args.port), app, log=None, error_log=None, handler_class=handler, **tls)
    server.init_socket()
    if timing_log is not None:
        rxstamp.enable(server.socket)  # accepted connections inherit it
    host, port = server.socket.getsockname()[:2]
    app.replica = args.replica_name or f"{host}:{port}"
    return Served(app, server, f"{'https' if tls else 'http'}://{host}:{port}", max(0.0, args.log_stats_interval))


def main(argv: list[str] | None = None) -> int:
    from vllm_load.lifeline import from_environment

    from_environment()  # embedded in a run: gone with it, however it ends
    try:
        served = build(sys.argv[1:] if argv is None else argv)
    except BadArguments as exc:
        sys.stderr.write(f"emulator: error: {exc}\n")
        return 2
    app = served.app
    print(f"vllm-load emulator listening on {served.url} model {' '.join(app.served + app.loras)}", flush=True)
    served.start()
    try:
        served.server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
