"""The target, checked before any load: host, model, tokenizer, lengths and each API's prompt minimum;
and the run's options as written to disk (secrets removed)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.client.openai_api import auth_header, discover_model
from vllm_load.plugin.server_wait import parse_duration
from vllm_load.workload.datasets import read_records
from vllm_load.workload.lengths import LengthSpec, parse_length
from vllm_load.workload.prompts import PromptFactory
from vllm_load.workload.tokenizer import Tokenizer, load_tokenizer

#: Output length when --output-tokens is not given (with a dataset: the dataset's own answer length).
DEFAULT_OUTPUT_TOKENS = "64"
#: Option names never written to disk or logs.
SECRET_OPTIONS = ("api_key", "sidecar_token")


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


def resolve_target(opts: Any, host: str, is_emulator: bool, apis: frozenset[str] = frozenset({"chat", "completions"})
                   ) -> Target:
    """Check host, model, tokenizer and lengths for the APIs the run's users send (``apis``); raise
    UsageError with one line on bad input."""
    input_spec = parse_length(opts.input_tokens, "--input-tokens")
    output_spec = parse_length(opts.output_tokens or DEFAULT_OUTPUT_TOKENS, "--output-tokens")
    if opts.request_rate < 0 or opts.burstiness <= 0 or opts.max_concurrency < 1 or opts.ramp_up < 0:
        raise UsageError("--request-rate must be >= 0, --burstiness > 0, --max-concurrency >= 1 and --ramp-up >= 0")
    if opts.shared_prefix_tokens < 0:
        raise UsageError(f"--shared-prefix-tokens must be >= 0, got {opts.shared_prefix_tokens}")
    backoff_max = parse_duration(opts.retry_backoff_max, "--retry-backoff-max")
    outage_after = parse_duration(opts.outage_after, "--outage-after")
    stop_on_outage = parse_duration(opts.stop_on_outage, "--stop-on-outage")
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
    served = discover_model(host, opts.model, opts.api_key)
    tok_name = opts.tokenizer or served.id
    tok = load_tokenizer(tok_name)
    limit = served.max_model_len
    if limit and input_spec.high + output_spec.high > limit:
        raise UsageError(
            f"input {input_spec.high} + output {output_spec.high} tokens exceed the server's max_model_len {limit}: "
            "lower --input-tokens or --output-tokens"
        )
    for api in sorted(apis):
        # raises the one-line reason when this tokenizer cannot build prompts for the API (no chat template)
        factory = PromptFactory(tok, api, salt="probe", shared_prefix_tokens=opts.shared_prefix_tokens)  # type: ignore[arg-type]
        if not opts.dataset and input_spec.low < factory.min_tokens:
            parts = f"template {factory.overhead}" + (
                f" + shared prefix {factory.shared_prefix_tokens}" if factory.shared_prefix_tokens else "")
            raise UsageError(
                f"--input-tokens {input_spec.text} goes below the {factory.min_tokens}-token minimum of a {api} prompt "
                f"with tokenizer {tok_name!r} ({parts} + 1 word): raise it to at least {factory.min_tokens}"
            )
    if opts.align_with_server:
        checked = align_with_server(host, served.id, tok, opts.api_key, apis)
        print(f"vllm-load: --align-with-server: {checked}", flush=True)
    return Target(host, served.id, tok_name, limit, is_emulator, input_spec, output_spec, backoff_max, outage_after,
                  stop_on_outage)


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
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v):
            out[k] = list(v)
    return out
