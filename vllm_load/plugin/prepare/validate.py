"""Every option checked before the run: one line that names the fix, exit 2, nothing started.

What the target check (``target.resolve_target``) cannot see without a server is here: numbers that are not
finite or out of range, the target URL's scheme, Locust's own -u and -t against vllm-load's, options of a
locustfile other than the one running. The locustfile's classes add their own (``check_options``).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from vllm_load.client.apis.openai_api import public_url
from vllm_load.errors import UsageError
from vllm_load.features import FEATURES
from vllm_load.options import OPTIONS
from vllm_load.workload.lengths import parse_duration
from vllm_load.workload.rate_schedule import RateSchedule
from vllm_load.workload.tokenizer import check_name
from vllm_load.plugin.lifecycle.run_timer import run_seconds
from vllm_load.plugin.prepare.plan import ramp_kind, scenario_applied, why_no_window
from vllm_load.plugin.lifecycle.shapes import UsersRamp
from vllm_load.plugin.prepare.target import class_headers

#: float options and the least value each takes (inclusive unless the name is in _POSITIVE)
_AT_LEAST = {"request_rate": 0.0, "min_duration": 0.0, "ramp_up": 0.0, "ramp_up_start_rps": 0.0, "ramp_up_end_rps": 0.0, "temperature": 0.0, "emulator_ttft": 0.0,
             "emulator_itl": 0.0, "audio_seconds": 0.0, "system_idle_cap": 0.0}
_POSITIVE = {"request_timeout", "step_duration", "trace_speed", "burstiness", "profile_seconds"}
#: int options and their least value
_INT_AT_LEAST = {"ramp_up_start_users": 0, "ramp_up_end_users": 0, "emulator_max_num_seqs": 0, "prompt_pool": 1, "max_concurrency": 1, "emulator_tokens_per_chunk": 1, "batch_size": 1,
                 "num_requests": 0, "images_per_request": 0, "repeat": 1, "videos_per_request": 0, "video_frames": 1}
#: the most each takes: every prompt's media is made before the run, --prompt-pool of them per process (10,000
#: images per request, or an hour of audio, outlasted -t in start-up alone); more is no load a server is sized for
_AT_MOST = {"images_per_request": 64, "audio_seconds": 120.0, "videos_per_request": 8, "video_frames": 256}
#: may be infinite: vLLM's --burstiness inf is a constant rate
_INFINITE_OK = {"burstiness", "max_idle"}  # --max-idle inf: no per-turn cap (AgentX)


def split_hosts(host: str | None) -> tuple[str, ...]:
    """``--host`` as its targets: one URL, or several separated by commas (replicas of one model; users are
    spread over them round robin, so a URL listed twice gets twice the users). Each is checked (``check_host``);
    () without a host."""
    if not host:
        return ()
    hosts = tuple(h.strip() for h in host.split(","))
    if "" in hosts:
        raise UsageError(f"--host {host!r} has an empty entry: separate the targets' URLs with single commas")
    for h in hosts:
        check_host(h)
    return hosts


def check_host(host: str | None) -> None:
    """http:// or https:// with a host name; the one-line fix otherwise."""
    if not host:
        return
    if "," in host:
        split_hosts(host)
        return
    parts = urlsplit(host)
    if not parts.scheme or not parts.netloc:
        if "://" not in host:
            raise UsageError(f"--host {host!r} has no scheme: write --host http://{host}")
        raise UsageError(f"--host {host!r} is not a URL: write e.g. --host http://127.0.0.1:8000")
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"--host {host!r}: the {parts.scheme}:// scheme is not served; use http:// or https://")
    if "@" in parts.netloc:  # said without them: the URL would carry them into logs, files and reports
        raise UsageError(f"--host {public_url(host)!r} carries credentials (user:password@): give the key with "
                         "--api-key (or a header with --header), not in the URL")
    try:
        _ = parts.port  # urlsplit checks the port only when it is read
    except ValueError:
        raise UsageError(f"--host {host!r} has no valid port: ports are 1-65535") from None


def check_numbers(opts: Any) -> None:
    _check_ranges(opts)
    confidence = getattr(opts, "confidence", 0.95)
    if not 0 < confidence < 1:
        raise UsageError(f"--confidence {confidence:g} must be between 0 and 1, e.g. 0.95")
    _check_media(opts)
    from vllm_load.workload.lengths import parse_length

    # the lengths and the body, as the target's check reads them: here before any server is asked (the web UI's
    # form took input_tokens=-5 or extra_body={bad, answered "Swarming started", and sat at 0 requests)
    for flag, value in (("--input-tokens", opts.input_tokens), ("--output-tokens", opts.output_tokens),
                        ("--emulator-reasoning-tokens", getattr(opts, "emulator_reasoning_tokens", ""))):
        if value:
            parse_length(value, flag)
    if getattr(opts, "extra_body", ""):
        from vllm_load.plugin.prepare.target import body_defaults
        body_defaults(opts)
    _check_exports(opts)
    if getattr(opts, "metric_percentiles", ""):
        from vllm_load.metrics.histogram import parse_percentiles
        parse_percentiles(opts.metric_percentiles)
    _check_mixes(opts)
    spec = getattr(opts, "emulator_spec_tokens", 0)
    if spec < 0 or not 0.0 <= getattr(opts, "emulator_spec_acceptance", 0.7) <= 1.0:
        raise UsageError("--emulator-spec-tokens must be >= 0 and --emulator-spec-acceptance within 0..1")
    if spec and getattr(opts, "emulator_profile", "") not in ("", "fixed"):
        raise UsageError("--emulator-spec-tokens runs on the emulator's fixed schedule: drop --emulator-profile")
    check_sidecars(getattr(opts, "sidecar_url", ""))
    if not 0 <= opts.metrics_port <= 65535:
        raise UsageError(f"--metrics-port {opts.metrics_port} is no TCP port: give 1-65535 (0: off)")


def _check_mixes(opts: Any) -> None:
    """What each request may become, read and checked before any server is asked: --cancel, --model's weights,
    --response-format's schema and --accuracy's sets (a bad file is one line before the run)."""
    if getattr(opts, "cancel", ""):
        from vllm_load.workload.cancel import parse_cancel
        parse_cancel(opts.cancel)
    if getattr(opts, "model", ""):  # its weights, before a server is asked which ids it serves
        from vllm_load.workload.model_mix import parse_models
        parse_models(opts.model)
    if getattr(opts, "response_format", ""):
        from vllm_load.workload.structured import parse_response_format
        parse_response_format(opts.response_format)
    if getattr(opts, "accuracy", None):
        from vllm_load.workload.graded import load_set, parse_accuracy
        for s in parse_accuracy(opts.accuracy):
            load_set(s.kind, s.path)


def _check_ranges(opts: Any) -> None:
    """Every numeric option against its registry's bounds (finite, > 0, >= a floor, <= a ceiling)."""
    for o in OPTIONS:
        value = getattr(opts, o.dest, None)
        if o.kw.get("type") is float and isinstance(value, float):
            if math.isnan(value) or (math.isinf(value) and o.dest not in _INFINITE_OK):
                raise UsageError(f"{o.flag} {value} is not a finite number: give one, e.g. {o.flag} {o.default}")
            low = _AT_LEAST.get(o.dest)
            if o.dest in _POSITIVE and not value > 0:
                raise UsageError(f"{o.flag} must be > 0, got {value:g}")
            if low is not None and value < low:
                raise UsageError(f"{o.flag} must be >= {low:g}, got {value:g}")
        elif o.kw.get("type") is int and o.dest in _INT_AT_LEAST and value < _INT_AT_LEAST[o.dest]:
            raise UsageError(f"{o.flag} must be >= {_INT_AT_LEAST[o.dest]}, got {value}")
        if o.dest in _AT_MOST and isinstance(value, (int, float)) and value > _AT_MOST[o.dest]:
            raise UsageError(f"{o.flag} {value:g} is more than {_AT_MOST[o.dest]:g}, the most a request carries here "
                             "(each prompt's media is made before the run): give less")


def _check_media(opts: Any) -> None:
    """--image-size and the media folders, read before the run."""
    if getattr(opts, "images_per_request", 0) or getattr(opts, "images_from", "") or getattr(opts, "audio_from", ""):
        import random

        from vllm_load.workload.media import AUDIO_TYPES, IMAGE_TYPES, MediaFiles, parse_image_size
        parse_image_size(opts.image_size)
        if opts.images_from:
            MediaFiles(opts.images_from, IMAGE_TYPES, "--images-from", random.Random())
            if not opts.images_per_request:
                raise UsageError("--images-from needs --images-per-request N: how many of its images each request carries")
        if opts.audio_from:
            MediaFiles(opts.audio_from, AUDIO_TYPES, "--audio-from", random.Random())
    if getattr(opts, "videos_per_request", 0) or getattr(opts, "videos_from", ""):
        import random

        from vllm_load.workload.media import VIDEO_TYPES, MediaFiles, parse_image_size
        parse_image_size(opts.video_size, "--video-size")
        if opts.videos_from:
            MediaFiles(opts.videos_from, VIDEO_TYPES, "--videos-from", random.Random())
            if not opts.videos_per_request:
                raise UsageError("--videos-from needs --videos-per-request N: how many of its videos each request "
                                 "carries")


def _check_exports(opts: Any) -> None:
    """Where the run's numbers go besides its directory (OTLP, MLflow/W&B) and where GPU telemetry comes from."""
    if getattr(opts, "otlp_endpoint", ""):
        check_http_url(opts.otlp_endpoint, "--otlp-endpoint", "http://127.0.0.1:4318")
        from vllm_load.report.exports.otlp import check_available
        check_available()
    if getattr(opts, "mlflow_uri", "") or getattr(opts, "wandb_project", ""):
        from vllm_load.report.exports.trackers import check_available as trackers_available
        trackers_available(opts)
    if getattr(opts, "router_metrics", ""):
        check_http_url(opts.router_metrics, "--router-metrics", "http://127.0.0.1:29000/metrics")
        if not (getattr(opts, "fault", None) or getattr(opts, "fault_plan", "")):
            raise UsageError("--router-metrics is read at a fault plan's actions: give --fault or --fault-plan")
    if getattr(opts, "dcgm_selector", ""):
        if not opts.prometheus_url or opts.dcgm_url:
            raise UsageError("--dcgm-selector reads the GPUs through --prometheus-url: give --prometheus-url, and "
                             "drop --dcgm-url (which reads the exporter itself)")
        from vllm_load.plugin.sources.prometheus_source import check_selector
        why = check_selector(opts.dcgm_selector, "--dcgm-selector")
        if why:
            raise UsageError(why)


def check_http_url(value: str, flag: str, example: str) -> None:
    """``flag``'s value is an http(s) URL with a host; otherwise the one-line fix (its credentials not shown)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{flag} {public_url(value)!r} is not an http(s) URL, e.g. {example}")


def check_sidecars(value: str) -> None:
    """--sidecar-url: http(s) URLs, each once (one replica's sidecar listed twice summed that replica twice)."""
    if not value:
        return
    urls = [u.strip().rstrip("/") for u in str(value).split(",")]
    for u in urls:
        check_http_url(u, "--sidecar-url", "http://127.0.0.1:9101")
    twice = next((u for i, u in enumerate(urls) if u in urls[:i]), None)
    if twice is not None:
        raise UsageError(f"--sidecar-url lists {public_url(twice)} twice: one sidecar per replica, each once (its "
                         "series would be summed twice)")


def check_locustfile_options(opts: Any, classes: list[Any]) -> None:
    """A locustfile-specific option (``Option.locustfiles``) given to a run none of whose classes reads it."""
    for o in OPTIONS:
        if not o.read_by(classes) and getattr(opts, o.dest, o.default) != o.default:
            files = " or ".join(f"locustfiles/{f}" for f in o.locustfiles)
            raise UsageError(f"{o.flag} is read by {files} only, not by this locustfile: drop it, or run {files} "
                             f"(a locustfile of yours that reads it names {o.dest!r} in its class's uses_options)")


def check_run(opts: Any, *, headless: bool, shape: Any) -> None:
    """Locust's own -u and -t against vllm-load's options."""
    if shape is None and headless and opts.num_users == 0:
        raise UsageError("-u 0 starts no user: give -u 1 or more")
    warmup = parse_duration(opts.warmup, "--warmup")
    parse_duration(opts.drain_timeout, "--drain-timeout")
    length, what = (opts.step_duration, "--step-duration") if shape is not None and opts.sweep else (
        opts.run_time, "the run (-t)")
    if getattr(opts, "min_duration", 0.0) and not getattr(opts, "num_requests", 0):
        raise UsageError(f"--min-duration {opts.min_duration:g} needs --num-requests N: the run ends on a whole pass "
                         "of N requests once it has lasted that long")
    if getattr(opts, "num_requests", 0):
        if opts.trace:
            raise UsageError("--num-requests with --trace: a trace ends with its last row; drop one of them")
        if shape is not None and not opts.sweep:
            raise UsageError("--num-requests ends a run or each step of a --sweep; a locustfile's own load shape "
                             "ends when it says: drop one of them")
    if getattr(opts, "ramp_up_strategy", ""):
        check_ramp(opts, shape)
    if getattr(opts, "rate_schedule", ""):
        check_schedule(opts, shape)
    if getattr(opts, "window", "run") == "steady" and (why := why_no_window(opts, shape is not None)):
        raise UsageError(f"--window steady judges the SLOs on the run's steady window, and this run has none: {why}; "
                         "judge the whole run (--window run)")
    if warmup and length and warmup >= length:
        raise UsageError(f"--warmup {opts.warmup} is not shorter than {what} ({length:g} s): nothing would be "
                         "measured; shorten --warmup or lengthen the run")


def check_ramp(opts: Any, shape: Any) -> None:
    """--ramp-up-strategy: an open loop of its own (a rate ramp) or the closed loop's users, over a known length."""
    strategy, start, end = opts.ramp_up_strategy, opts.ramp_up_start_rps, opts.ramp_up_end_rps
    users = ramp_kind(opts) == "users"
    if users and (start or end):
        raise UsageError("--ramp-up-strategy ramps either the rate (--ramp-up-*-rps, open loop) or the users "
                         "(--ramp-up-*-users, closed loop): drop one pair")
    if users:
        first, last = opts.ramp_up_start_users, opts.ramp_up_end_users
        if last < 1 or (strategy == "exponential" and first < 1):
            raise UsageError(f"--ramp-up-strategy {strategy} needs --ramp-up-end-users >= 1"
                             + (" and --ramp-up-start-users >= 1" if strategy == "exponential" else ""))
    elif not end > 0 or (strategy == "exponential" and not start > 0):
        raise UsageError(f"--ramp-up-strategy {strategy} needs --ramp-up-end-rps > 0"
                         + (" and --ramp-up-start-rps > 0" if strategy == "exponential" else "")
                         + " (or --ramp-up-start-users/--ramp-up-end-users for the closed loop)")
    clash = [flag for flag, given in (("--request-rate", opts.request_rate), ("--ramp-up", opts.ramp_up),
                                      ("--trace", opts.trace), ("a load shape", shape is not None)) if given]
    if clash:
        raise UsageError(f"--ramp-up-strategy sets the {'users' if users else 'rate'} from its start to its end: "
                         f"drop {clash[0]}")
    if users and not opts.run_time:
        raise UsageError("--ramp-up-strategy ramps the users over the run's time: give -t (e.g. -t 60s)")
    if not opts.run_time and not getattr(opts, "num_requests", 0):
        raise UsageError("--ramp-up-strategy ramps over the run: give -t (e.g. -t 60s) or --num-requests N")


def check_schedule(opts: Any, shape: Any) -> None:
    """--rate-schedule: a file that reads, the open loop's only rate; a run with no -t ends at its last row."""
    schedule = RateSchedule.read(opts.rate_schedule)
    clash = [flag for flag, given in (("--request-rate", opts.request_rate), ("--ramp-up", opts.ramp_up),
                                      ("--ramp-up-strategy", opts.ramp_up_strategy), ("--trace", opts.trace),
                                      ("--sweep", getattr(opts, "sweep", "")), ("a load shape", shape is not None),
                                      ("--num-requests", getattr(opts, "num_requests", 0))) if given]
    if clash:
        raise UsageError(f"--rate-schedule sets the rate over the run's time: drop {clash[0]}")
    if not opts.run_time and schedule.end <= 0:
        raise UsageError(f"--rate-schedule {opts.rate_schedule} has one row: give -t (e.g. -t 60s) for how long its "
                         "rate holds")


def run_classes(environment: Any) -> tuple[Any, list[Any]]:
    """The run's load shape (None: Locust's own users and rate, or the plugin's users ramp) and the classes whose
    ``uses_options`` and ``check_options`` count: its users and that shape."""
    shape = environment.shape_class
    if isinstance(shape, UsersRamp):  # the plugin's own, for --ramp-up-strategy over users
        shape = None
    return shape, [*environment.user_classes, *([type(shape)] if shape is not None else [])]


def check_options(environment: Any) -> None:
    """Everything above, and each user and shape class's ``check_options``; raises UsageError."""
    opts = environment.parsed_options
    check_numbers(opts)
    if getattr(opts, "tokenizer", ""):  # before the embedded emulator starts: an unknown one is refused at once
        check_name(opts.tokenizer)
    for feature in FEATURES:  # each feature's own options (vllm_load/features/)
        feature.validate(opts)
    check_host(environment.host)
    shape, classes = run_classes(environment)
    check_locustfile_options(opts, classes)
    headless = bool(opts.headless or getattr(opts, "autostart", False))
    scenario_applied(opts, run_seconds(opts) if headless else None)  # its values, before the classes' checks
    class_headers(getattr(opts, "class_header", None))
    check_run(opts, headless=headless, shape=shape)
    if getattr(opts, "profile_at", ""):
        from vllm_load.plugin.sources.server_control import profile_point

        profile_point(opts)
    if getattr(opts, "fault", None) or getattr(opts, "fault_plan", ""):  # once the locustfile registered its hooks
        from vllm_load.plugin.watch.fault_plan import check_hooks, check_targets, parse_plan

        actions = parse_plan(opts.fault, opts.fault_plan)
        check_hooks(actions)
        check_targets(actions, split_hosts(environment.host))
    for cls in classes:
        check = getattr(cls, "check_options", None)
        if check is not None:
            check(opts)
