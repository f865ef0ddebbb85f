"""The end of a run: sweep verdicts and step directories, live outage notices, the server side, the results,
the report, the console's last lines and the exit code."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event

from vllm_load.client.apis.openai_api import auth_header, public_url
from vllm_load.redact import redact_urls
from vllm_load.errors import EXIT_ERRORS, EXIT_OK, EXIT_OUTPUT, OutputError
from vllm_load.features import FEATURES
from vllm_load.metrics.judge.verdict import feature_lines, judge, render_checks
from vllm_load.plugin.lifecycle import interrupt
from vllm_load.plugin.lifecycle.collector import Collector
from vllm_load.plugin.lifecycle.run import Run
from vllm_load.plugin.sources.server_side import fetch_samples
from vllm_load.report.console import render_table
from vllm_load.report.results import render_validity

if TYPE_CHECKING:
    from vllm_load.plugin.lifecycle.controller import Controller

log = logging.getLogger("vllm_load")


class Ending:
    """What the end of a run leaves on its process: the last report, the stopped run's judged summary (the web UI's
    until the next start), the end-of-run block (printed when Locust quits, after its own last tables), and the end
    being written (a signal that comes meanwhile waits for it)."""

    def __init__(self) -> None:
        self.report: str | None = None  # the last run's report.html
        self.final_summary: dict | None = None  # the stopped run's judged summary
        self.block = ""  # the end-of-run block
        self.writing: gevent.event.Event | None = None  # set once the end is written
        #: set by a second Ctrl-C or SIGTERM: the end stops waiting for requests in flight (they are cut)
        self.cut = gevent.event.Event()
        self.signals = 0  # stopping signals this process took, SIGINT and SIGTERM (``plugin/lifecycle/interrupt.py``)
        self.first_signal: tuple[str, float] | None = None  # the first of them, and when (wall clock)

    def started(self) -> None:
        """A new run: live numbers again."""
        self.final_summary = None

    def print_block(self) -> None:
        """When Locust quits: after its final tables (printed after the quitting event, then the quit event fires),
        one readable block at the very end of a headless run's output, not between Locust's tables."""
        if self.block:
            sys.stderr.flush()  # Locust's tables (stderr) first
            sys.stdout.write(self.block)
            sys.stdout.flush()
            self.block = ""


def judge_step(ctl: Controller, step: int) -> bool:
    """Did a finished sweep step meet every SLO (client metrics)? Judged once (its ``Verdict`` kept with its Step)."""
    col = ctl.run.collector if ctl.run is not None else None
    if col is None or col.sweep is None:
        return True
    known = col.sweep.steps.get(step) is not None and col.sweep.steps[step].verdict is not None
    verdict = col.sweep.judge(step, list(ctl.slos), col.plan.computed_percentiles)
    if not known and verdict.slo_passed is False:
        missed = ", ".join(c.slo for c in verdict.checks if not c.passed)
        print(f"vllm-load: sweep step {step} ({col.sweep.steps[step].level:g}) missed {missed}: stopping the sweep",
              flush=True)
    return verdict.slo_passed is not False


def _write_sweep(col: Collector, exit_code: int) -> None:
    if col.sweep is None or not col.sweep.steps:
        return
    from vllm_load.report.html import build
    from vllm_load.report.sweep import REPEAT_HEAD, build_sweep
    from vllm_load.rundir.steps import write_step_dirs

    dirs = write_step_dirs(col.plan.files.path, col.sweep, col.end_wall or time.time())
    for d in dirs:
        build(d)
    page, best, repeats = build_sweep(dirs, col.plan.files.path, exit_code=exit_code)
    repeated = int(getattr(col.opts, "repeat", 1) or 1) > 1  # --repeat N: N repeats, not a sweep of N steps
    print(f"vllm-load: {f'{len(dirs)} repeats' if repeated else f'sweep of {len(dirs)} steps'}: {best} ({page})",
          flush=True)
    for row in repeats:  # repeated levels: their spread, run to run
        print("vllm-load: repeated " + ", ".join(f"{h} {v}" for h, v in zip(REPEAT_HEAD, row)), flush=True)


def _collect_server_side(col: Collector, opts: Any) -> None:
    if col.end_wall is None:
        return
    start, end = col.start_wall - 2, col.end_wall + 2  # the run's window, 2 s either side
    if opts.prometheus_url:  # a Prometheus that scrapes vLLM already: no sidecar needed
        from vllm_load.plugin.sources.prometheus_source import fetch_range

        samples, why = fetch_range(opts.prometheus_url, opts.prometheus_selector, start, end, opts.prometheus_token)
    elif col.plan.sidecar_url:
        # fresh: the sidecar scrapes as it is asked, so the series holds the last requests' steps (read as it stood,
        # it ended up to a scrape interval before them: an acceptance length of 2.8603 where each request gave 2.8571)
        samples, why = fetch_samples(col.plan.sidecar_url, start, end, opts.sidecar_token, fresh=True)
    else:
        return
    if why:
        log.warning("vllm-load: server side missing from the report: %s", why)
    else:
        col.plan.files.write_series(col.plan.files.server, samples)


def _take_spans(ctl: Controller, col: Collector) -> None:
    """--otlp-receiver: the spans of the run's last requests waited for (within span_receiver.WAIT_S), then kept in
    spans.jsonl for the report to join; once per run."""
    rx = ctl.servers.span_receiver
    if rx is None or col.plan.files.spans.exists():
        return
    from vllm_load.plugin.sources.span_receiver import MAX_SPANS, WAIT_S

    s = col.results
    expected = int(getattr(s, "succeeded", 0) or 0) + int(getattr(s, "warmup_excluded", 0) or 0) if s else 0
    if rx.dropped:
        print(f"vllm-load: the OTLP receiver kept {MAX_SPANS} server spans, its most for a run, and dropped "
              f"{rx.dropped} more (the report joins those it kept)", flush=True)
    elif not rx.wait_for(expected):
        print(f"vllm-load: {len(rx.spans)} server spans for {expected} answered requests within {WAIT_S:.0f} s of the "
              "run's end (the report joins those that came)", flush=True)
    col.plan.files.write_series(col.plan.files.spans, rx.spans)


def _output_failed(run: Run, exc: BaseException) -> None:
    """A file of the run could not be written: said once, in one line; the run ends with exit code 6."""
    message = str(exc) if isinstance(exc, OutputError) or not isinstance(exc, OSError) else str(
        OutputError.of(exc, "the run's files"))
    if run.fatal_code == EXIT_OUTPUT and run.fatal:
        return
    run.stop_with(message, EXIT_OUTPUT)
    sys.stderr.write(f"vllm-load: error: {message}\n")
    sys.stderr.flush()


def stopped(ctl: Controller) -> None:
    """Locust's test_stop: the run's results, spans and server side written; a web UI links its report at once."""
    environment, run = ctl.environment, ctl.run
    col = run.collector if run is not None else None
    if run is None or col is None:
        return
    col.mark_end()
    opts = environment.parsed_options
    if col.faults and getattr(opts, "router_metrics", ""):  # the router's doing up to the end, for the last action
        from vllm_load.plugin.watch.fault_plan import read_router

        col.router_end = read_router(opts.router_metrics)
    if col.profiler is not None:  # the profiled window ends with the run (the drain's requests included)
        col.profiler.stop()
    try:
        _write_results(ctl, run, col)
        _take_spans(ctl, col)
        _collect_server_side(col, opts)
        if environment.web_ui is not None:  # the web UI links the report as soon as a run stops
            from vllm_load.report.html import build

            built = build(col.plan.files.path)
            ctl.end.report = str(built.report)
            # the web UI shows the run as judged from now on, not numbers recomputed against a moving clock
            # (its output rate kept falling with wall time, 183 -> 52 tok/s, and the verdict kept sampling)
            ctl.end.final_summary = {**dict(built.summary.to_json() if hasattr(built.summary, "to_json")
                                        else built.summary), "server": built.server, "final": True}
            print(f"vllm-load: run {col.plan.run_id} stopped: report {ctl.end.report} (the LLM tab links it)", flush=True)
    except (OSError, OutputError) as exc:  # no traceback out of Locust's handler: quitting gives the verdict
        _output_failed(run, exc)


def _write_results(ctl: Controller, run: Run, col: Collector) -> None:
    """The run's results, with the first stopping signal the process took (an interrupted run says so)."""
    col.signal = ctl.end.first_signal
    col.write_results(_local_monitor(run))


def _local_monitor(run: Run) -> Any:
    """A local run's client monitor (its last, partial report joins the verdict); None on a master."""
    return run.generator.monitor if run.generator is not None else None


def quitting(ctl: Controller) -> None:
    """The end of the run, once. Locust runs a shutdown per SIGTERM (in that signal's greenlet), and its main
    greenlet runs one more when the runner stops: two wrote two different summaries. A later one waits for the
    first, then for the first to exit the process (with its code); a SIGTERM is counted with the SIGINTs
    (``interrupt.repeated``: the second signal cuts, the third quits)."""
    end = ctl.end
    signalled = gevent.getcurrent().parent is not None  # not the main greenlet: a SIGTERM's shutdown
    n = interrupt.noted(end, signal.SIGTERM) if signalled else 0
    if end.writing is None:
        end.writing = gevent.event.Event()
        try:
            _end(ctl)
        finally:
            end.writing.set()
        return
    if signalled and (n >= 3 or not end.writing.is_set()):  # while the end is written: a second signal at least
        interrupt.repeated(max(n, 2), signal.SIGTERM)
    end.writing.wait()
    # the first shutdown goes on to Locust's tables and its exit, which ends the process (its SystemExit reaches
    # the main greenlet with the run's code): this one waits for that rather than printing and exiting again
    gevent.sleep(30.0)


def _end(ctl: Controller) -> None:
    run = ctl.run
    col = run.collector if run is not None else None
    if run is not None and col is not None:
        # SIGTERM/SIGINT fire quitting before Locust stops the users: drain here too (no-op after a stop)
        ctl.drain()
        if col.profiler is not None:  # a signal skips test_stop
            col.profiler.stop()
        _csv_catch_up(ctl.environment)
        col.mark_end()
        try:
            if run.fatal and run.fatal_code == EXIT_OUTPUT:  # files already missing: no report to build
                raise OutputError(run.fatal)
            _finish(ctl, run, col)
        except (OSError, OutputError) as exc:  # the disk refused: the verdict still reaches the console
            _output_failed(run, exc)
            _finish_unwritten(ctl, run, col)
    if run is not None:
        run.close()
    ctl.servers.release()  # --load-lora's adapters off the servers, whichever way the run ended


def _csv_catch_up(environment: Any) -> None:
    """--csv: Locust writes its CSV files only on a 1 s timer (its shutdown just closes them), so the requests
    answered in the last second (the drain's) were in its final table and not in its CSV (284 against 286). Waiting
    out one more of its writes makes the CSV the final table; Locust's writer offers nothing else to wait on."""
    if getattr(environment.parsed_options, "csv_prefix", None):
        from locust.stats import CSV_STATS_INTERVAL_SEC

        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.1)


def _table_title(ctl: Controller, col: Collector) -> str:
    """The console table's title: the run, and whether its target was the built-in emulator."""
    target = ctl.target
    banner = (" (target: built-in EMULATOR, not a real vLLM)" if target and target.is_emulator else
              " (target: the vLLM EMULATOR, standalone, not a real vLLM)" if target and target.emulated else "")
    return f"vllm-load LLM metrics, run {col.plan.run_id}{banner}"


def _export_otlp(col: Collector, opts: Any) -> None:
    """--otlp-endpoint: the run's metrics to an OpenTelemetry collector, once; a failure is said, not fatal."""
    if not getattr(opts, "otlp_endpoint", ""):
        return
    from vllm_load.report.exports.otlp import export

    why = export(opts.otlp_endpoint, col.totals, col.measured_from, col.end_wall or time.time(),
                 {"vllm_load.run_id": col.plan.run_id, "vllm_load.model": col.plan.model,
                  "vllm_load.target": "emulator" if col.plan.is_emulator else col.plan.host},
                 auth_header(opts.otlp_token) or None)
    if why:
        log.warning("vllm-load: the metrics did not go over OTLP: %s", redact_urls(why))
    else:
        print(f"vllm-load: metrics sent over OTLP to {public_url(opts.otlp_endpoint)}", flush=True)


def _finish_unwritten(ctl: Controller, run: Run, col: Collector) -> None:
    """The end of a run whose directory could not take its files: the table and verdict from memory."""
    summary = col.results if col.results is not None else col.summarise(_local_monitor(run))
    environment = ctl.environment
    opts = environment.parsed_options
    verdict = judge(summary, list(ctl.slos), None, int(opts.min_requests), bool(opts.allow_untrustworthy),
                    0 if col.plan.sweep_kind else col.plan.num_requests, bool(opts.strict_load), vars(opts))
    sys.stdout.write("\n" + render_table(summary, _table_title(ctl, col)) + "\n")
    if render_validity(verdict):
        sys.stdout.write(render_validity(verdict) + "\n")
    if verdict.checks:
        sys.stdout.write(render_checks(verdict.checks) + "\n")
    sys.stdout.write(f"vllm-load: the run was stopped: {run.fatal}\n")
    sys.stdout.write(f"vllm-load: the run directory {col.plan.files.path} is incomplete (exit code {EXIT_OUTPUT})\n")
    sys.stdout.flush()
    environment.process_exit_code = EXIT_OUTPUT


def _finish(ctl: Controller, run: Run, col: Collector) -> None:
    """The end of a run: results, server side, reports, the console's table and verdict, the exit code."""
    environment = ctl.environment
    opts = environment.parsed_options
    if col.results is None:  # test_stop wrote them already, after the drain (a signal skips test_stop)
        _write_results(ctl, run, col)
    _export_otlp(col, opts)
    _take_spans(ctl, col)
    if not col.plan.files.server.exists():
        _collect_server_side(col, opts)
    from vllm_load.report.html import build  # the report (Jinja2, its charts) is loaded only at the end of a run

    if run.generator is not None:
        run.generator.flush_log()  # the report reads this process's request log
    built = build(col.plan.files.path, junit=opts.junit)
    code = built.verdict.exit_code  # a stopped or interrupted run's code is the verdict's too (vllm_load/features/)
    exceptions = sum(row["count"] for row in environment.runner.exceptions.values())
    if code == EXIT_OK and exceptions:  # Locust's own rule, which our exit code would otherwise mask
        code = EXIT_ERRORS
    _write_sweep(col, code)  # its page says the run's exit code
    ctl.end.report = str(built.report)
    log_file = ctl.servers.emulator_log
    if log_file is not None and log_file.exists():  # its log, beside the run's numbers
        col.plan.files.copy_in(log_file, "emulator.log")
    prefix = getattr(opts, "csv_prefix", None)
    if prefix:  # Locust's --csv PREFIX: the LLM table beside Locust's own files
        shutil.copyfile(col.plan.files.llm_csv, f"{prefix}_llm_stats.csv")
    after = [line for f in FEATURES if (hook := f.hook("after_run")) is not None  # the history records the run
             for line in hook(str(col.plan.files.path), code, vars(opts))]
    # the end-of-run block, printed once, after Locust's own last tables (Controller._on_quit)
    ctl.end.block = "".join(_end_lines(ctl, run, col, built, exceptions, code, after))
    environment.process_exit_code = code


def _end_lines(ctl: Controller, run: Run, col: Collector, built: Any, exceptions: int, code: int,
               after: list[str]) -> list[str]:
    """The console's last block: the LLM table, why the run stopped or how far it can be trusted, the checks."""
    environment = ctl.environment
    lines = ["\n" + render_table(built.summary, _table_title(ctl, col), server=built.server) + "\n"]
    said = feature_lines(built.summary, vars(environment.parsed_options))  # stopped, interrupted: first
    lines += [line + "\n" for line in said]
    if render_validity(built.verdict):
        lines.append(render_validity(built.verdict) + "\n")
    through_client = environment.runner.stats.total.num_requests
    if not built.summary.requests and through_client:
        lines.append(f"vllm-load: no self.llm request completed; the {through_client} requests Locust counted went "
                     "through self.client, which is not LLM-timed: send LLM requests with self.llm.chat/complete\n")
    if exceptions:
        lines.append(f"vllm-load: user tasks raised {exceptions} exceptions (Locust's error report lists "
                     "them; the log shows each kind once)\n")
    if built.verdict.checks:
        lines.append(render_checks(built.verdict.checks) + "\n")
    from vllm_load.report.exports.trackers import log_run  # --mlflow-uri, --wandb-project: what the directory holds

    lines += [line + "\n" for line in log_run(environment.parsed_options, col.plan.files.path)]
    lines += [line + "\n" for line in after]
    lines.append(f"vllm-load: report {built.report} (exit code {code})\n")
    lines.append(_next_steps(col, built.report) + "\n")
    return lines


def _next_steps(col: Collector, report: Any) -> str:
    """One line of what to do next: open the report, compare with another run, point at a real server."""
    hints = [f"open {report} in a browser", f"compare with another run: vllm-load compare {col.plan.files.path} OTHER"]
    if col.plan.is_emulator:
        hints.append("measure a real server: --host http://HOST:8000")
    return "next: " + "; ".join(hints)
