"""The target, checked before any load: host, model, tokenizer, lengths and each API's prompt minimum;
and the run's options as written to disk (secrets removed)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.options import DEFAULT_OUTPUT_TOKENS  # with a dataset: the dataset's own answer length
from vllm_load.client.apis.openai_api import auth_header, discover_model, is_credential_header, server_identity
from vllm_load.client.stream import BodyDefaults
from vllm_load.workload.lengths import parse_duration
from vllm_load.plugin.swarm.worker_secrets import SECRET_OPTIONS
from vllm_load.workload.inputs.datasets import read_records
from vllm_load.workload.lengths import LengthSpec, parse_length
from vllm_load.workload.model_mix import parse_models
from vllm_load.workload.prompts import PromptFactory, prompt_api
from vllm_load.workload.structured import parse_response_format
from vllm_load.workload.tokenizer import Tokenizer, load_tokenizer
from vllm_load.plugin.lifecycle.run_timer import RUN_TIME_ATTR

#: body keys the measurement itself sets: --extra-body may not take them over
_MEASURED_KEYS = ("stream", "messages", "prompt")


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """--header 'Name: value' (repeatable) -> headers; a malformed one is refused with one line (value unsaid)."""
    out: dict[str, str] = {}
    for v in values or []:
        name, sep, value = str(v).partition(":")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            shown = name if sep else str(v)[:40] if not is_credential_header(str(v)) else "(hidden)"
            raise UsageError(f"--header {shown!r} is not 'Name: value': write e.g. --header 'X-Tenant: team-a'")
        out[name] = value.strip()
    return out


def body_defaults(opts: Any, server_kind: str = "vllm") -> BodyDefaults:
    """--temperature, --no-ignore-eos, --no-continuous-usage and --extra-body (the numbers checked before the run by
    plugin/prepare/validate.py; --extra-body here, one line on bad input). A server that is not vLLM (``server_kind``
    "openai") gets standard OpenAI fields only: no ignore_eos/min_tokens, no continuous_usage_stats."""
    extra: Any = {}
    if opts.extra_body:
        try:
            extra = json.loads(opts.extra_body)
        except ValueError as exc:
            raise UsageError(f"--extra-body is not JSON ({exc}): write a JSON object, e.g. --extra-body "
                             "'{\"top_k\": 20}'") from None
        if not isinstance(extra, dict):
            raise UsageError("--extra-body must be a JSON object, e.g. --extra-body '{\"top_k\": 20}'")
        taken = [k for k in _MEASURED_KEYS if k in extra]
        if taken:
            raise UsageError(f"--extra-body sets {', '.join(taken)}, which the load test sends itself: drop them")
    vllm = server_kind == "vllm"
    shaped = parse_response_format(getattr(opts, "response_format", ""))  # JSON asked: lengths are the model's
    if shaped is not None and shaped.body is not None:
        extra = {**extra, "response_format": shaped.body}
    return BodyDefaults(temperature=float(opts.temperature), ignore_eos=vllm and not opts.no_ignore_eos and shaped is None,
                        continuous_usage=vllm and not opts.no_continuous_usage, extra=tuple(sorted(extra.items())))


def server_kind(opts: Any, served: Any) -> str:
    """--server-kind, or from /v1/models: vLLM says owned_by "vllm"; any other server is sent standard OpenAI
    fields only (vLLM's ignore_eos, min_tokens and continuous_usage_stats are refused or ignored elsewhere)."""
    kind = getattr(opts, "server_kind", "auto") or "auto"
    if kind != "auto":
        return kind
    return "vllm" if served.owned_by == "vllm" else "openai"


#: headers a class may not set: credentials (--api-key-file's, never an option's) and the transport's own
_NOT_BY_CLASS = ("authorization", "proxy-authorization", "cookie", "x-api-key", "host", "content-length",
                 "transfer-encoding", "connection", "content-type")


def class_headers(values: list[str] | None) -> dict[str, dict[str, str]]:
    """--class-header 'NAME:HEADER=VALUE' (repeatable): the requests named NAME carry HEADER (an SLO-aware router
    reads a class's objective or tier from it); bad input is one line."""
    out: dict[str, dict[str, str]] = {}
    for v in values or []:
        name, _, rest = str(v).partition(":")
        header, sep, value = rest.partition("=")
        header = header.strip()
        if not name.strip() or not sep or not header or any(c.isspace() or c in ":=" for c in header):
            raise UsageError(f"--class-header {str(v)[:60]!r} is not NAME:HEADER=VALUE: write e.g. --class-header "
                             "'interactive:x-slo-ttft-ms=200'")
        if header.lower() in _NOT_BY_CLASS:
            raise UsageError(f"--class-header {header}: a class does not set {header} (credentials come from "
                             "--api-key-file or VLLM_LOAD_API_KEY; the transport sets its own)")
        out.setdefault(name.strip(), {})[header] = value.strip()
    return out


def request_headers(opts: Any) -> dict[str, str]:
    """Every streaming request's headers: content negotiation, the bearer token, then --header."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
    headers.update(auth_header(opts.api_key))
    headers.update(parse_headers(opts.header))
    return headers


@dataclass
class Target:
    """The server under test, validated before any load is sent."""

    host: str
    model: str
    tokenizer: str
    max_model_len: int | None
    is_emulator: bool
    input_spec: LengthSpec
    output_spec: LengthSpec
    # run options in seconds, parsed once here (a bad one is refused before the run) for the run plan
    backoff_max: float = 2.0  # --retry-backoff-max
    outage_after: float = 2.0  # --outage-after
    stop_on_outage: float = 0.0  # --stop-on-outage (0: never)
    tokenizer_source: str = "--tokenizer"  # how the tokenizer was chosen, said at start-up
    models: tuple[str, ...] = ()  # --model a,b: requests rotate over them (the first is ``model``)
    warmup: float = 0.0  # --warmup, seconds
    trace_rows: int = 0  # --trace: its rows, and the seconds its last one is due after the first (at --trace-speed)
    trace_span: float = 0.0
    server_kind: str = "vllm"  # "vllm", or "openai": standard OpenAI fields only (--server-kind, or /v1/models)
    owned_by: str = ""  # what /v1/models said
    server_version: str = ""  # what /version said ("" when the server has none)
    #: the replicas users are spread over (--host a,b): each checked like ``host``; () for one target
    hosts: tuple[str, ...] = ()
    model_weights: tuple[float, ...] = ()  # --model a:0.6,b:0.4: each model's share (none: equal turns)
    emulated: bool = False  # /version says the target is vllm-load's emulator (a standalone one, not embedded)

    @property
    def kind(self) -> str:
        """What the numbers describe, in a few words: decided here, kept in config.json (``target_kind``) and
        shown from there (the web UI's header and LLM tab, the console, the report, compare)."""
        if self.is_emulator or self.emulated:  # the embedded one, or one the user serves (it says so at /version)
            said = [*([] if self.is_emulator else ["standalone"]),
                    *([f"of vLLM {self.server_version}"] if self.server_version else [])]
            return "EMULATOR" + (f" ({', '.join(said)})" if said else "")
        if self.server_kind == "vllm":
            return f"vLLM {self.server_version}" if self.server_version else "vLLM (version unknown)"
        return f"OpenAI-compatible server (owned_by {self.owned_by!r})" if self.owned_by else "OpenAI-compatible server"


def resolve_target(opts: Any, host: str, is_emulator: bool, apis: frozenset[str] = frozenset({"chat", "completions"})
                   ) -> Target:
    """Check host, model, tokenizer and lengths for the APIs the run's users send (``apis``); raise
    UsageError with one line on bad input."""
    input_spec = parse_length(opts.input_tokens, "--input-tokens")
    output_spec = parse_length(opts.output_tokens or DEFAULT_OUTPUT_TOKENS, "--output-tokens")
    backoff_max = parse_duration(opts.retry_backoff_max, "--retry-backoff-max")
    outage_after = parse_duration(opts.outage_after, "--outage-after")
    stop_on_outage = parse_duration(opts.stop_on_outage, "--stop-on-outage")
    warmup = parse_duration(opts.warmup, "--warmup")
    _check_inputs(opts)
    trace = _check_trace(opts)
    headers = request_headers(opts)
    body_defaults(opts)
    models, weights = parse_models(opts.model)  # --model a,b (or a:0.6,b:0.4): none asked, the server's first
    served = discover_model(host, models[0] if models else "", opts.api_key, headers=headers)
    for other in models[1:]:
        discover_model(host, other, opts.api_key, headers=headers)  # each must be served: one line if not
    tok, tok_name, tokenizer_source = _tokenizer_for(opts.tokenizer, served)
    limit = served.max_model_len
    if trace:
        longest = max(trace, key=lambda r: r.input_tokens + r.output_tokens)
        if limit and longest.input_tokens + longest.output_tokens > limit:
            raise UsageError(f"trace row {longest.index} asks for {longest.input_tokens} + {longest.output_tokens} "
                             f"tokens, beyond the server's max_model_len {limit}: replay another trace or server")
    elif limit and input_spec.high + output_spec.high > limit:
        raise UsageError(
            f"input {input_spec.high} + output {output_spec.high} tokens exceed the server's max_model_len {limit}: "
            "lower --input-tokens or --output-tokens"
        )
    for api in sorted(apis):
        _check_minimum(opts, api, tok, tok_name, input_spec, trace)
    if opts.align_with_server:
        checked = align_with_server(host, served.id, tok, opts.api_key, apis)
        print(f"vllm-load: --align-with-server: {checked}", flush=True)
    version, emulated = server_identity(host, opts.api_key, headers=headers)
    return Target(host, served.id, tok_name, limit, is_emulator, input_spec, output_spec, backoff_max, outage_after,
                  stop_on_outage, tokenizer_source, tuple(models) if len(models) > 1 else (served.id,), warmup,
                  len(trace), trace[-1].at / opts.trace_speed if trace else 0.0, server_kind(opts, served),
                  served.owned_by, version, model_weights=weights if len(models) > 1 else (), emulated=emulated)


def _check_inputs(opts: Any) -> None:
    """The numeric and dataset options a target's check reads first (one line each)."""
    if opts.shared_prefix_tokens < 0:
        raise UsageError(f"--shared-prefix-tokens must be >= 0, got {opts.shared_prefix_tokens}")
    if opts.min_requests < 0:
        raise UsageError(f"--min-requests must be >= 0, got {opts.min_requests}")
    if opts.dataset:
        read_records(opts.dataset, opts.dataset_format, opts.dataset_field)
        if opts.dataset_batch < 0:
            raise UsageError(f"--dataset-batch must be >= 1, got {opts.dataset_batch}")
        if opts.dataset_answer_tokens < 0:
            raise UsageError(f"--dataset-answer-tokens must be >= 1, got {opts.dataset_answer_tokens}")
    elif opts.dataset_batch:
        raise UsageError("--dataset-batch needs --dataset: name the file whose records are batched")


def _check_minimum(opts: Any, api: str, tok: Any, tok_name: str, input_spec: Any, trace: list) -> None:
    """The shortest prompt asked must hold the API's template (and shared prefix) and a word; raises the one-line
    reason when this tokenizer cannot build prompts for the API at all (no chat template)."""
    factory = PromptFactory(tok, prompt_api(api), salt="probe", shared_prefix_tokens=opts.shared_prefix_tokens)
    if trace:
        short = min(trace, key=lambda r: r.input_tokens)
        if short.input_tokens < factory.overhead + 1:
            raise UsageError(f"trace row {short.index} asks for {short.input_tokens} input tokens, below the "
                             f"{factory.overhead + 1}-token minimum of a {api} prompt with tokenizer {tok_name!r}")
    elif not opts.dataset and input_spec.low < factory.min_tokens:
        parts = f"template {factory.overhead}" + (
            f" + shared prefix {factory.shared_prefix_tokens}" if factory.shared_prefix_tokens else "")
        raise UsageError(
            f"--input-tokens {input_spec.text} goes below the {factory.min_tokens}-token minimum of a {api} prompt "
            f"with tokenizer {tok_name!r} ({parts} + 1 word): raise it to at least {factory.min_tokens}"
        )


def resolve_targets(opts: Any, hosts: tuple[str, ...], is_emulator: bool, apis: frozenset[str]) -> Target:
    """``resolve_target`` for --host's list: every replica is checked as one target would be, and each must
    serve the model the first serves (users spread over them send it the same requests)."""
    first = resolve_target(opts, hosts[0], is_emulator, apis)
    if len(hosts) == 1:
        return first
    limits = [first.max_model_len]
    for other in hosts[1:]:
        checked = resolve_target(opts, other, False, apis)
        if checked.model != first.model:
            raise UsageError(f"--host {other} serves {checked.model!r}, not {first.model!r} as {hosts[0]} does: "
                             "the targets of one run are replicas of one model (pick it with --model)")
        limits.append(checked.max_model_len)
    known = [n for n in limits if n]
    return replace(first, host=",".join(hosts), hosts=hosts, max_model_len=min(known) if known else None)


def _check_trace(opts: Any) -> list:
    if not opts.trace:
        return []
    from vllm_load.workload.inputs.trace import read_trace

    if opts.dataset:
        raise UsageError("--trace and --dataset both say what to send: pick one")
    if not opts.trace_speed > 0:
        raise UsageError(f"--trace-speed must be > 0, got {opts.trace_speed}")
    if opts.trace_block_size < 1:
        raise UsageError(f"--trace-block-size must be >= 1, got {opts.trace_block_size}")
    if opts.request_rate:
        raise UsageError("--trace sets the arrival times itself: drop --request-rate")
    return read_trace(opts.trace, opts.trace_format)


def _tokenizer_for(given: str, served: Any) -> tuple[Tokenizer, str, str]:
    """--tokenizer, else the model vLLM loaded (``root`` of /v1/models: a --served-model-name alias is no
    tokenizer anyone can load), else the served name. Returns the tokenizer, its name and where it came from."""
    if given:
        return load_tokenizer(given), given, "--tokenizer"
    candidates = [(served.root, "the server's /v1/models root")] if served.root and served.root != served.id else []
    candidates.append((served.id, "the served model name"))
    failure: UsageError | None = None
    for name, source in candidates:
        try:
            return load_tokenizer(name), name, source
        except UsageError as exc:
            failure = failure or exc
    assert failure is not None
    raise failure


def align_with_server(host: str, model: str, tok: Tokenizer, api_key: str = "",
                      apis: frozenset[str] = frozenset({"chat", "completions"})) -> str:
    """Compare our counts with vLLM's POST /tokenize for the run's APIs; a mismatch stops the run.
    Returns what was checked, for the console."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **auth_header(api_key)}
    checked = []
    for api in ("completions", "chat"):
        if api not in apis or (api == "chat" and not tok.has_chat_template):
            continue
        prompt = PromptFactory(tok, api, salt=secrets.token_hex(4)).make(100)  # type: ignore[arg-type]
        body: dict = {"model": model}
        if api == "chat":
            body.update(messages=prompt.messages, add_generation_prompt=True)
        else:
            body.update(prompt=prompt.text, add_special_tokens=True)
        req = urllib.request.Request(host.rstrip("/") + "/tokenize", data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                count = int(json.loads(resp.read())["count"])
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise UsageError(f"--align-with-server: {host}/tokenize failed ({exc}): drop the flag for servers without it") from None
        if count != prompt.tokens:
            raise UsageError(
                f"--align-with-server: a {api} prompt of {prompt.tokens} tokens by tokenizer {tok.name!r} is "
                f"{count} tokens on the server: pass --tokenizer with the server's own tokenizer"
            )
        checked.append(f"a {prompt.tokens}-token {api} prompt")
    if not checked:
        return "nothing to check (no API of this run)"
    return (f"{' and '.join(checked)} by tokenizer {tok.name!r} counted the same on the server's /tokenize: "
            "prompt lengths match")


def public_options(opts: Any) -> dict:
    """The run's options as written to disk: msgpack/JSON-safe, secrets removed."""
    out = {}
    for k, v in sorted(vars(opts).items()):
        if k in SECRET_OPTIONS:
            out[k] = "***" if v else ""
        elif k == "header":
            out[k] = [f"{n}: ***" if is_credential_header(n) else f"{n}: {val}"
                      for n, val in parse_headers(v).items()] if v else []
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v):
            out[k] = list(v)
    if out.get(RUN_TIME_ATTR):  # -t as it was given (the plugin arms it from the load's start: run_timer.py)
        out["run_time"] = out.pop(RUN_TIME_ATTR)
    return out
