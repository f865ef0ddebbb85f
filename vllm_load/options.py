"""vllm-load's options, registered as Locust custom arguments, from one registry (``OPTIONS``) that the
parser, `vllm-load options` and the options table test (docs/options.md) all read.

They are settable on the command line, in locust.conf / pyproject.toml, from environment variables
and from the web UI, and Locust ships them to every worker in its spawn messages (so every value
here must be msgpack-encodable: strings, numbers, booleans). They are read only after start-up: what a
run decides travels in its plan (plugin/prepare/plan.py).
"""

from __future__ import annotations

import os
from typing import Any

from vllm_load.emulator_options import EMULATOR_OPTIONS
from vllm_load.features import FEATURES
from vllm_load.option_spec import Option, group

#: the lengths a run sends unless told: its prompts' and (with no dataset to give one) its answers'
DEFAULT_INPUT_TOKENS, DEFAULT_OUTPUT_TOKENS = "128", "64"

_DECLARED: tuple[Option, ...] = (*group(
    "target",
    Option("--model", "", "model to request; several, comma-separated (a base model and its LoRA adapters): requests "
        "rotate over them, or take each its share with weights (base:0.6,lora-a:0.3,lora-b:0.1), and the metrics are "
        "grouped per model", shown_default="the server's first /v1/models id"),
    Option("--load-lora", [], "NAME=PATH: load this LoRA adapter into every target before the run (vLLM's dynamic "
        "/v1/load_lora_adapter: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), unloaded at the end; repeat for more; then "
        "--model NAME sends to it", action="append", web=False),
    Option("--tokenizer", "", "tokenizer: HF id, local folder, or a built-in one: builtin:mistral-7b-v0.1 (SentencePiece, "
        "the emulator's), builtin:mistral-tekken (Tekken, for vLLM's --tokenizer-mode mistral)", shown_default="the model name",
        web=False),
    Option("--api-key", "", "bearer token for the server (never logged, written or shown in the web UI)",
        shown_default="$OPENAI_API_KEY, as OpenAI's clients read it", is_secret=True),
    Option("--api-key-file", "", "read the bearer token from this file (each process reads its own: a master sends "
        "no secret to its workers; give every worker this, VLLM_LOAD_API_KEY or OPENAI_API_KEY)", web=False),
    Option("--ca-bundle", "", "https:// targets: verify the server's certificate against these CA certificates (PEM)", web=False),
    Option("--insecure", False, "https:// targets: do not verify the server's certificate (a self-signed test server)",
        action="store_true"),
    Option("--wait-for-server", "0", "wait this long (30s, 15m, …) for the server's /health and /v1/models before the "
        "run, with a progress line every 10 s (a vLLM loading its model takes minutes)"),
    Option("--server-kind", "auto", "vllm: send vLLM's fields (ignore_eos, min_tokens, continuous_usage_stats) for exact "
        "lengths and per-chunk token counts; openai: standard OpenAI fields only (llama.cpp, TGI, SGLang, a gateway); "
        "auto: vllm when /v1/models says owned_by vllm", choices=["auto", "vllm", "openai"]),
    Option("--align-with-server", False, "before the run, check our token counts against the server's /tokenize",
        action="store_true"),
    Option("--request-timeout", 600.0, "seconds without a byte from the server before a request fails", type=float),
), *group(
    "workload",
    Option("--input-tokens", DEFAULT_INPUT_TOKENS, "prompt length in tokens as the server counts them: N, LOW-HIGH, normal:MEAN,STD "
        "(multiturn.py: the first user message's; later turns take --turn-input-tokens and carry the conversation; "
        "embeddings.py, rerank.py: each text's)"),
    Option("--output-tokens", "", "output length in tokens (forced with ignore_eos/min_tokens): N, LOW-HIGH, "
        "normal:MEAN,STD (with --dataset: the dataset's answer length, or the answer lines a --dataset-batch "
        "instruction asks for; the pooling locustfiles generate none)", shown_default=DEFAULT_OUTPUT_TOKENS),
    Option("--shared-prefix-tokens", 0, "deliberately share this many leading prompt tokens across requests", type=int),
    Option("--seed", -1, "repeatable runs: the same lengths, arrival times, dataset order and trace split every run "
        "(content stays unique per run unless --salt is given too); -1: fresh draws", type=int),
    Option("--salt", "", "fix the prompts' content too (a fresh salt per run, by default, so that a repeated run cannot "
        "hit the prefix cache the last one left)", shown_default="a fresh salt per run"),
    Option("--prompt-pool", 32, "prompts prepared ahead per process, off the event loop", type=int),
    Option("--turns", 3, "multiturn.py: turns per conversation (with --dataset: at most this many of each "
        "conversation's user turns)", type=int, locustfiles=("multiturn.py",)),
    Option("--turn-input-tokens", "50", "multiturn.py: tokens of each later user message: N, LOW-HIGH, "
        "normal:MEAN,STD", locustfiles=("multiturn.py",)),
    Option("--think-time", "0", "multiturn.py, agent.py, mixed.py: seconds between a reply and the next turn (mixed.py: "
        "the interactive class's next request): S or LOW-HIGH", locustfiles=("multiturn.py", "agent.py", "mixed.py")),
    Option("--tool-rounds", 2, "agent.py: tool calls per task before the model's final answer", type=int,
        locustfiles=("agent.py",)),
    Option("--tool-result-tokens", "200", "agent.py: tokens of each tool result: N, LOW-HIGH, normal:MEAN,STD",
        locustfiles=("agent.py",)),
    Option("--batch-after", "10s", "mixed.py: when the batch class starts sending, from the run's start (the "
        "interactive class runs alone until then: the protected class's baseline)", locustfiles=("mixed.py",)),
    Option("--batch-input-tokens", "1024", "mixed.py: the batch class's prompt length (as --input-tokens)", locustfiles=("mixed.py",)),
    Option("--batch-output-tokens", "128", "mixed.py: the batch class's answer length (as --input-tokens)", locustfiles=("mixed.py",)),
    Option("--batch-size", 1, "pooling requests: unique texts per embeddings request, documents per rerank request "
        "(each of --input-tokens)", type=int, locustfiles=("embeddings.py", "rerank.py")),
), *group(
    "images and audio",
    Option("--images-per-request", 0, "chat.py: this many unique images (JPEG data URLs) after each prompt's text",
        type=int, locustfiles=("chat.py",)),
    Option("--image-size", "512x512", "chat.py: the images' size, WxH; each side a length (256-1024x512), or a list to "
        "draw from (256x256,1024x768)", locustfiles=("chat.py",)),
    Option("--images-from", "", "chat.py: the images come from this file or folder (jpg, png, webp, gif, bmp), in "
        "turn, instead of being generated: a file sent twice can hit vLLM's multimodal cache", locustfiles=("chat.py",), web=False),
    Option("--audio-from", "", "chat.py, transcription.py: one clip per request from this file or folder (wav, mp3), "
        "in turn, instead of --audio-seconds' generated ones", locustfiles=("chat.py", "transcription.py"), web=False),
    Option("--audio-seconds", 0.0, "chat.py: one unique audio clip (16 kHz WAV, input_audio) of this many seconds "
        "after each prompt's text; 0: none. transcription.py: each request's unique clip (0: 5 s)", type=float,
        locustfiles=("chat.py", "transcription.py")),
    Option("--videos-per-request", 0, "chat.py: this many unique videos (Motion-JPEG AVI data URLs, video_url) after "
        "each prompt's text", type=int, locustfiles=("chat.py",)),
    Option("--video-frames", 8, "chat.py: each generated video's frames (at 2 a second)", type=int,
        locustfiles=("chat.py",)),
    Option("--video-size", "224x224", "chat.py: the videos' frame size, WxH, as --image-size", locustfiles=("chat.py",)),
    Option("--videos-from", "", "chat.py: the videos come from this file or folder (mp4, avi, webm, mov), in turn, "
        "instead of being generated: a file sent twice can hit vLLM's multimodal cache", locustfiles=("chat.py",),
        web=False),
), *group(
    "load shape",
    Option("--num-requests", 0, "end the run once this many requests finished, across all workers (warm-up aside), as "
        "vllm bench serve --num-prompts; in a --sweep, each step ends after this many (its --step-duration unused); "
        "0: the run ends by -t", type=int),
    Option("--min-duration", 0.0, "with --num-requests N: the run (each --sweep step) lasts at least this many seconds, "
        "then ends on the next whole pass of its N requests (MLPerf Endpoints' points: a duration floor, then whole "
        "passes of the dataset); 0: it ends after N", type=float),
    Option("--response-format", "", "structured output: json_object or json_schema:FILE asks every request for JSON "
        "(vLLM's guided decoding; lengths then the model's) and checks every answer: the share valid, "
        "'valid_output>=99%' gates on it", web=False),  # it names a file: off the web form (its content went out)
    Option("--accuracy", [], "accuracy under load: KIND:FILE[:SHARE] (repeatable) makes SHARE (0.1) of the chat "
        "requests a graded set's items, named KIND, each answer graded: gsm8k (question, answer '#### N'), mmlu "
        "(question, choices, answer letter), json (prompt, schema); accuracy and its 95 % interval per set, "
        "'accuracy[gsm8k]>=0.8' gates on it", action="append", web=False),
    Option("--cancel", "", "a share of the requests the client gives up on mid-answer, as users close a tab: "
        "rate=SHARE,after=Ntok (e.g. rate=0.1,after=16tok: every tenth request is cut once it carried 16 tokens); "
        "counted apart (neither success nor failure) and logged with their partial timings"),
    Option("--warmup", "0", "requests started in the first DURATION of the run (and of each sweep step) are sent and "
        "logged as warm-up, and left out of every metric, SLO and plot (the report says how many), e.g. 30s"),
    Option("--request-rate", 0.0, "open loop: total requests/s over all users and workers (0: closed loop, one "
        "request in flight per user)", type=float),
    Option("--burstiness", 1.0, "open loop: gamma shape of inter-arrival times (1 = Poisson)", type=float),
    Option("--rate-schedule", "", "open loop: the total rate over the run from a CSV file (at,rate[,between,"
        "burstiness] rows: step or linear between them, each segment's own gamma shape), as a daily curve; a run with "
        "no -t ends at its last row; each segment's delivered rate and latencies are reported (docs/load-and-tune.md)",
        web=False),
    Option("--ramp-up", 0.0, "open loop: seconds over which the rate grows linearly to --request-rate "
        "(closed loop ramps with Locust's own -r/--spawn-rate)", type=float),
    Option("--ramp-up-strategy", "", "open loop: the rate goes from --ramp-up-start-rps to --ramp-up-end-rps over the "
        "run (-t, or --num-requests' count), linear or exponential, as vllm bench serve's option; closed loop: the "
        "users go from --ramp-up-start-users to --ramp-up-end-users over -t",
        choices=["", "linear", "exponential"]),
    Option("--ramp-up-start-rps", 0.0, "--ramp-up-strategy: the total rate at the run's start (req/s)", type=float),
    Option("--ramp-up-end-rps", 0.0, "--ramp-up-strategy: the total rate at the run's end (req/s)", type=float),
    Option("--ramp-up-start-users", 0, "--ramp-up-strategy, closed loop: the users at the run's start (-u is unused)",
        type=int),
    Option("--ramp-up-end-users", 0, "--ramp-up-strategy, closed loop: the users at the run's end", type=int),
    Option("--stop-over-saturated", False, "end the run (or the sweep) once the server stops keeping up: its queue and "
        "TTFT both rising with significance (always detected and reported; this stops there)", action="store_true"),
    Option("--max-concurrency", 1000, "open loop: most requests in flight per user (more arrivals are sent late)",
        type=int),
    Option("--sweep", "", "locustfiles/sweep.py: comma-separated levels (users, or req/s with --sweep-mode rate); "
        "LEVELxN repeats one N times (16x5): the sweep gives each repeated level's mean and confidence interval",
        locustfiles=("sweep.py",)),
    Option("--repeat", 1, "run the load N times back to back, each as long as -t (or --num-requests): each repeat a "
        "step of its own (steps/), the mean ± half its --confidence interval over them; with --reset-prefix-cache the "
        "server's cache emptied before each (a sweep repeats a level with --sweep LEVELxN); decided at start-up, so "
        "not in the web UI's form", type=int, web=False),
    Option("--confidence", 0.95, "the confidence of the intervals over repeated steps (--sweep 16x5)", type=float,
        locustfiles=("sweep.py",)),
    Option("--sweep-mode", "users", "sweep over 'users' (closed loop) or 'rate' (open loop, --sweep-users users)",
        choices=["users", "rate"], locustfiles=("sweep.py",)),
    Option("--sweep-users", 32, "users that carry an open-loop rate sweep", type=int, locustfiles=("sweep.py",)),
    Option("--step-duration", 60.0, "seconds per sweep step", type=float, locustfiles=("sweep.py",)),
    Option("--stop-on-slo-miss", False, "end the sweep at the first step that misses an SLO", action="store_true",
        locustfiles=("sweep.py",)),
    Option("--drain-timeout", "30s", "at the end of a run, how long (30s, 2m, …) in-flight streams may take to finish "
        "before they are cancelled"),
), *group(
    "request body",
    Option("--no-ignore-eos", False, "do not send ignore_eos/min_tokens (output length is then up to the model)",
        action="store_true"),
    Option("--no-continuous-usage", False, "do not ask for stream_options.continuous_usage_stats (servers that refuse "
        "it): each text chunk then counts as one token and ITL per token equals ITL per chunk", action="store_true"),
    Option("--temperature", 0.0, "sampling temperature of every request", type=float),
    Option("--extra-body", "", "a JSON object merged into every request body, e.g. '{\"top_k\": 20}' (a task's own "
        "keys win)"),
    Option("--header", [], "an HTTP header 'Name: value' on every request (repeatable); values of credential-like "
        "names (Authorization, *token*, *key*, cookie …) are never logged or written", action="append",
        web=False),
    Option("--class-header", [], "NAME:HEADER=VALUE: the requests named NAME (name=, e.g. mixed.py's interactive "
        "and batch) carry that header, for an SLO-aware router (e.g. 'interactive:x-slo-ttft-ms=200'); repeatable",
        action="append", web=False),
    Option("--session-header", "X-Session-ID", "the request header a session's id goes in (self.llm.session(); "
        "multiturn.py's conversations, agent.py's tasks): vLLM's router hashes X-Session-ID with --policy "
        "consistent_hash to keep a session on one replica"),
    Option("--capture-header", [], "log this response header of every request (its value in the request log's "
        "headers; repeatable), e.g. the replica a router sent it to; its answers' heads are then read by Python",
        action="append", web=False),
), *group(
    "datasets and traces",
    Option("--dataset", "", "take prompts from this file (ShareGPT .json, .jsonl, .csv), or from a Hugging Face "
        "dataset saved locally (hf:PATH, a save_to_disk folder; hf:NAME reads the Hub's, which needs network; "
        "pip install 'vllm-load[hf]'), instead of synthetic text", web=False),
    Option("--dataset-format", "", "sharegpt, jsonl or csv", shown_default="from the file extension"),
    Option("--dataset-field", "", "JSONL field or CSV column holding the text", shown_default="text / first column"),
    Option("--dataset-batch", 0, "classify this many dataset records per prompt under one instruction (1 = the same "
        "instruction with one record, to compare with K); 0: each record is a prompt as it is", type=int),
    Option("--dataset-answer-tokens", 0, "with --dataset-batch: answer tokens per record (0: the tokens of the "
        "longest answer line the instruction asks for)", type=int),
    Option("--trace", "", "replay a trace: each row sent once by the whole swarm at its timestamp (from the run's "
        "start, latency counted from there), with its input and output length; the run ends with the trace", web=False),
    Option("--trace-format", "", "mooncake (JSON lines: timestamp ms, input_length, output_length, hash_ids) or csv "
        "(timestamp, input and output length: BurstGPT's and Azure's column names work)",
        shown_default="from the extension"),
    Option("--trace-speed", 1.0, "replay this many times faster than recorded (0.5: half speed)", type=float),
    Option("--trace-block-size", 512, "tokens per hash id of a Mooncake trace: the same id, the same block of "
        "content, so the server's prefix cache sees the reuse the trace recorded", type=int),
    Option("--sessions", "", "sessions.py: replay these agent sessions (a Weka/AgentX trace file or folder, "
        "sessions JSONL, or 'synthetic:sessions=50,turns=4-12,growth=200-1500,subagents=0.2' made up: "
        "docs/sessions.md): each turn sent when its predecessor completed plus its recorded delay, subagents forked "
        "and joined, each session on one user with its own --session-header id",
        locustfiles=("sessions.py",), web=False),
    Option("--sessions-format", "", "sessions.py: weka or jsonl", shown_default="jsonl for .jsonl, else weka",
        choices=["", "weka", "jsonl"], locustfiles=("sessions.py",)),
    Option("--session-start", "", "sessions.py: MIN,MAX (fractions, e.g. 0,1): each user's first session starts at its "
        "first turn at or after t*, drawn uniformly in that share of the trace's recorded duration as AIPerf draws "
        "it (seeded by --seed; a sessions JSONL without recorded times: that share of its turns), after one warm-up turn, the one before it, "
        "which carries the whole history so far and is left out of the numbers; later sessions start at their first "
        "turn. Empty: every session from its first turn", locustfiles=("sessions.py",)),
    Option("--session-align", "none", "sessions.py with --session-start: 'instant' starts every user's first session "
        "at one instant, once every user of the process sent its warm-up turn (AIPerf's t*); 'none': each after its "
        "own warm-up", choices=["none", "instant"], locustfiles=("sessions.py",)),
    Option("--scenario", "", "a public workload's rules as one option: 'agentx-mvp' (sessions.py: AIPerf's "
        "inferencex-agentx-mvp spec: exact output lengths, a fresh cache-bust marker on every play, idle time capped at "
        "10 s system-wide with no per-turn cap, traces recycled until -t (900 s or more); t* anywhere in a trace), "
        "'agentx' (sessions.py: AIPerf 0.14's inferencex-agentx preset: those rules, and t* in 25-75 % at one instant, "
        "seed 42, the server's token counts, aborted past 10 % failed requests; docs/sessions.md), "
        "'mlperf-endpoints' (any locustfile, a --sweep of concurrencies or one: MLPerf Endpoints v1.0's draft rules: "
        "each point at least 600 s (1-32 users) or 1,200 s, then whole passes of its --num-requests; a qualification "
        "run, not a submission; docs/load-and-tune.md); the run is stamped valid or not, every override named",
        choices=["", "agentx-mvp", "agentx", "mlperf-endpoints"]),
    Option("--reuse-distance", "0", "reuse.py: tokens of other work between a prefix and its return, e.g. "
        "0,4096,16384: the reuse curve gives each distance's cached share (where the server's cache forgets)",
        locustfiles=("reuse.py",)),
    Option("--cache-bust", "none", "sessions.py: 'trajectory' makes each session tree's content its own (its "
        "subagents share it): no prompt shares a prefix with another trajectory's, even through global hash ids "
        "(AIPerf's AgentX first-turn cache bust; --scenario agentx sets it); 'none': blocks shared as the ids say",
        choices=["none", "trajectory"], locustfiles=("sessions.py",)),
    Option("--max-idle", 10.0, "sessions.py: the longest wait between a turn's completion and the next turn (a "
        "recorded coffee break is cut to this; 'inf': none, as AgentX's rules ask, which cap idle time system-wide "
        "instead: --system-idle-cap)", type=float, locustfiles=("sessions.py",)),
    Option("--system-idle-cap", 0.0, "sessions.py: while no request of the process is in flight, every pending turn "
        "moves earlier by the same amount so the next is due within this many seconds, their spacing kept (AIPerf's "
        "--system-idle-gap-cap-seconds; AgentX's 10 s); 0: off", type=float, locustfiles=("sessions.py",)),
    Option("--recycle", False, "sessions.py: replay the sessions again from their first turn when all were replayed, "
        "each play's content its own under --cache-bust trajectory, until -t (AgentX's lanes); off: the run ends "
        "once every session was replayed", action="store_true", locustfiles=("sessions.py",)),
), *group(
    "SLOs and gates",
    Option("--slo", [], "an SLO like 'ttft.p99<=500ms' or a YAML/TOML file of them; repeat for more",
        action="append", web=False),
    Option("--recipe", "", "a named goal judged with the SLOs: 'max-goodput[:90%]': at least that share of the requests "
        "met every per-request limit (each ttft/tpot/e2e --slo's threshold) at once; a sweep names the largest level "
        "that held it and its goodput", web=False),
    Option("--window", "run", "what the SLOs judge: 'run' (every measured request) or 'steady' (the requests that ran "
        "while every user was sending: the ramp and the drain left out; the report shows both)",
        choices=["run", "steady"], web=False),
    Option("--min-requests", 1, "fewer successful requests than this make the run fail (exit 4): a gate must not pass "
        "on a run that measured nothing", type=int),
    Option("--allow-untrustworthy", False, "accept a run the tool calls untrustworthy (the client could not keep "
        "time, or a worker was lost): exit by the SLOs instead of with code 5", action="store_true"),
    Option("--strict-load", False, "fail the run (exit 4) when the load delivered was not the load asked: an open "
        "loop's sent rate or inter-arrival CV beyond its sampling band, a closed loop's requests in flight under 90 % "
        "of its users (said in every run either way)", action="store_true"),
    Option("--junit", "", "write the SLO verdict as JUnit XML here too", shown_default="only <run dir>/junit.xml (every run writes it)",
           web=False),
    Option("--retry-backoff-max", "2s", "closed loop: after a connection failure (refused, reset, connect timeout) a "
        "user waits 50 ms, doubling up to this, with jitter (also the cap on a server's Retry-After)"),
    Option("--outage-after", "2s", "connection failures with no success for this long are reported as a server outage"),
    Option("--stop-on-outage", "0", "end the run (exit 1) once an outage has lasted this long (0: never)"),
), *group(
    "outputs",
    Option("--run-dir", "", "where the run's files go; a DIR holding an earlier run is left whole, this run going "
        "beside it as DIR-<run id>", shown_default="reports/<run id>", web=False),
    Option("--save-detailed", False, "vllm-result.json also holds the per-request arrays (input_lens, output_lens, "
        "ttfts, itls, latencies, errors …), as vllm bench serve --save-detailed", action="store_true"),
    Option("--no-figures", False, "write no figures: by default the headline charts (latency and throughput over the "
        "run, a sweep's against its level) are written as PNG and SVG into the run directory's figures/ and shown "
        "in summary.md, for a CI job summary or a pull request", action="store_true"),
    Option("--metric-percentiles", "", "the percentiles shown (console, summary, report, vllm-result.json), as vllm "
        "bench serve's option, e.g. 25,50,99,99.9; computed exactly from the histograms",
        shown_default="50,90,95,99,99.9"),
    Option("--otlp-endpoint", "", "at the run's end, send its LLM metrics over OpenTelemetry (OTLP/HTTP) to this "
        "collector, e.g. http://otel-collector:4318 (the Prometheus export's names and buckets; pip install "
        "'vllm-load[otel]')", web=False),
    Option("--otlp-token", "", "bearer token of that collector, when it requires one", is_secret=True),
    Option("--otlp-receiver", "", "HOST:PORT (or PORT, on 127.0.0.1): receive the server's per-request OpenTelemetry "
        "spans here (give vLLM --otlp-traces-endpoint http://HOST:PORT/v1/traces and "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); each is joined to its request by the traceparent every "
        "request carries: queue, prefill and decode per request (pip install 'vllm-load[otel]')", web=False),
    Option("--mlflow-uri", "", "at the run's end, log it to MLflow at this tracking URI (its options, numbers, verdict "
        "and report), e.g. http://mlflow:5000 (pip install 'vllm-load[mlflow]')", web=False),
    Option("--mlflow-experiment", "vllm-load", "--mlflow-uri: the experiment the run goes into", web=False),
    Option("--wandb-project", "", "at the run's end, log it to this Weights & Biases project (its options, numbers, "
        "verdict and report; WANDB_API_KEY or WANDB_MODE=offline from the environment; pip install "
        "'vllm-load[wandb]')", web=False),
    Option("--metrics-port", 0, "serve the client's metrics in Prometheus' format on this port (headless runs; with "
        "the web UI they are on its port, /metrics); 0: off", type=int, web=False),
    Option("--metrics-host", "127.0.0.1", "address of --metrics-port (0.0.0.0 exposes it beyond this host; it answers "
        "to this machine's names and each --web-allowed-host, and to no browser page)", web=False),
), *group(
    "web UI",
    Option("--web-allowed-host", [], "a host name the web UI answers to besides 127.0.0.1, localhost and --web-host "
        "(a name in front of it: a proxy, a tunnel's name); repeatable; other Host headers are refused",
        action="append", web=False),
    Option("--web-password-file", "", "--web-login's password, from this file (or $VLLM_LOAD_WEB_PASSWORD; without "
        "either, one is made for the run and its file named at start-up)", web=False),
), *group(
    "server side",
    Option("--reset-prefix-cache", False, "empty the server's prefix cache (vLLM's POST /reset_prefix_cache, served "
        "with VLLM_SERVER_DEV_MODE=1) before the run and before each sweep step, so none inherits the last one's "
        "hits; a server that refuses it is said once", action="store_true"),
    Option("--fault", [], "a fault plan's action on the run's clock, 'AT: KIND: WHAT' (repeatable): KIND kill, stop, "
        "start, restart or exec runs the command WHAT (e.g. '30s: kill: kill -9 $(cat r2.pid)'), call runs the "
        "locustfile's @vllm_load.on_fault(WHAT) hook, drain/undrain takes --host's replica WHAT out of the "
        "rotation (its users send to the next) and back; once per swarm; the disruption verdict judges each",
        action="append", web=False),
    Option("--fault-plan", "", "a file of --fault actions, one per line ('#' comments)", web=False),
    Option("--router-metrics", "", "the router's Prometheus endpoint (vllm-router's --prometheus-port, e.g. "
        "http://127.0.0.1:29000/metrics), read at each --fault action's start and at the run's end: the disruption "
        "verdict says what the router did about each (retries, requests it gave up on, each worker's failures and "
        "circuit breaker)", web=False),
    Option("--profile-at", "", "run vLLM's profiler (POST /start_profile, /stop_profile: vLLM started with "
        "--profiler-config) at a chosen load: N (once the server runs N requests, from the sidecar's or Prometheus' "
        "series, for --profile-seconds), 'run' (the measured window, after --warmup), or step:LEVEL (a sweep's first "
        "step at LEVEL, from its start to the next step's); the window lands in summary.json (profiled); a server "
        "that refuses it is said once, and the run goes on"),
    Option("--profile-seconds", 10.0, "how long --profile-at N profiles (the run's end stops it sooner)", type=float),
    Option("--sidecar-url", "", "the sidecar (python -m server.sidecar) beside vLLM; its series lands in the run dir "
           "(auto with the emulator); one per replica, comma-separated, with --host a,b: merged into the fleet's"),
    Option("--sidecar-token", "", "bearer token of the sidecar, when it requires one", is_secret=True),
    Option("--prometheus-url", "", "read the server side from this Prometheus (which scrapes vLLM) over the run's "
        "window, instead of a sidecar, e.g. http://prometheus.monitoring:9090"),
    Option("--prometheus-selector", "", "the label selector of vLLM's series in that Prometheus, e.g. "
        "'{namespace=\"llm\",pod=~\"vllm-.*\"}'", shown_default="every vllm:* series"),
    Option("--prometheus-token", "", "bearer token of that Prometheus, when it requires one", is_secret=True),
    Option("--dcgm-url", "", "GPU telemetry: a DCGM exporter's /metrics, read every second on the client's clock; "
        "the run reports energy (J), average power, energy per output token and per request, tokens per joule "
        "(SLO: energy_per_token<=0.5J), e.g. http://dcgm-exporter:9400/metrics"),
    Option("--dcgm-selector", "", "GPU telemetry through --prometheus-url (instead of --dcgm-url): the label selector "
        "of the serving GPUs' DCGM_FI_DEV_* series, read over the run's window at its end, e.g. "
        "'{Hostname=\"gpu-node-1\"}' ('{}': every GPU that Prometheus has)"),
), *EMULATOR_OPTIONS, *(o for f in FEATURES for o in f.options))  # each feature's rows, in its own module
#: every option, group by group (a feature's rows join their group where it stands)
_GROUP_ORDER = {name: i for i, name in enumerate(dict.fromkeys(o.group for o in _DECLARED))}
OPTIONS: tuple[Option, ...] = tuple(sorted(_DECLARED, key=lambda o: _GROUP_ORDER[o.group]))


#: `vllm-load options` groups, in the order it prints them: each option's group, as its definition says
GROUPS: dict[str, tuple[str, ...]] = {}
for _o in OPTIONS:
    GROUPS[_o.group] = (*GROUPS.get(_o.group, ()), _o.flag)


def add_arguments(parser: Any) -> None:
    # Locust's own add_argument (not an argument group) understands is_secret/include_in_web_ui.
    for o in OPTIONS:
        default = o.default
        if o.dest == "api_key":  # the variable every OpenAI client reads; VLLM_LOAD_API_KEY and --api-key win
            default = os.environ.get("OPENAI_API_KEY", "")
        extra = {} if o.web else {"include_in_web_ui": False}
        parser.add_argument(o.flag, default=default, env_var=o.env, help=f"{o.help} [env {o.env}]", **o.kw, **extra)
