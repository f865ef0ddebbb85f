"""`vllm-load report RUN_DIR...`: rebuild reports (and an SLO verdict) from saved run directories;
`vllm-load compare RUN_A RUN_B`: what changed between two runs, beyond noise;
`vllm-load tune --serve CMD --grid NAME=V1,V2 --slo … -- RUN OPTIONS`: the best server configuration;
`vllm-load locustfile NAME`: where a shipped locustfile is (for installs without a checkout)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OUTPUT, OutputError, UsageError


LOCUSTFILES = ("chat", "completions", "multiturn", "agent", "sessions", "sweep", "embeddings", "rerank", "responses",
              "messages", "mixed", "reuse", "transcription")


def parse_share(text: str, flag: str) -> float:
    """A share as the options write one: 5% or 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a share: give e.g. 5% or 0.05") from None
    if not 0 <= value < 10:
        raise UsageError(f"{flag} {text!r} must be a share of at least 0, e.g. 5%")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tune"]:  # its own parser: the options after -- go to every probe as they are
        from vllm_load.tune.run import main as tune_main

        return tune_main(argv[1:])
    if argv[:1] == ["history"]:  # the results store (vllm_load/history/cli.py)
        from vllm_load.history.cli import main as history_main

        return history_main(argv[1:])
    ap = argparse.ArgumentParser(prog="vllm-load", description="vllm-load reports and verdicts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tune", help="find the server configuration that carries the most load within the SLOs "
                   "(vllm-load tune --help)")
    sub.add_parser("history", help="the results store: list runs, a metric's series and change points, import "
                   "run directories, the history page (vllm-load history --help)")
    rp = sub.add_parser("report", help="rebuild report.html, summary.json/.md and the SLO verdict of run directories",
                        description="Rebuild a run directory's report.html, summary.json/.md and SLO verdict from its "
                        "files (judged again by other SLOs with --slo); with several run directories, also the sweep "
                        "report comparing them. The exit code is the verdict's, as the run's own (the worst one of several).",
                        epilog="example: vllm-load report reports/RUN --slo 'ttft.p99<=500ms' --junit junit.xml")
    rp.add_argument("run_dirs", nargs="+", help="one or more run directories")
    rp.add_argument("--slo", action="append", default=[], help="SLOs to judge by (default: the run's own)")
    rp.add_argument("--junit", default="", help="also write the JUnit XML here")
    rp.add_argument("--out", default="", help="with several runs: where the sweep report goes")
    cp = sub.add_parser("compare", help="what changed from run A to run B (every metric and SLO verdict), flagging "
                        "changes beyond the histograms' error and the runs' own noise; writes compare.md/.html/.json",
                        description="What changed from run A to run B: first how the two were set up differently "
                        "(target, users, workers, options, trust), then every metric's mean and percentiles and every "
                        "SLO verdict, a change flagged only beyond the histograms' error and twice the runs' own "
                        "window-to-window noise. Writes compare.md, compare.html and compare.json.",
                        epilog="example: vllm-load compare reports/RUN_A reports/RUN_B")
    cp.add_argument("run_a", help="the run directory compared from (the baseline)")
    cp.add_argument("run_b", help="the run directory compared with it")
    cp.add_argument("--out", default="", help="where the comparison goes (default: RUN_B/compare)")
    cp.add_argument("--threshold", default="5%", help="a metric without a noise estimate (no 10 s windows) is "
                    "flagged only beyond this relative change (default: 5%%)")
    lp = sub.add_parser("locustfile", help="print the path of a shipped locustfile: locust -f \"$(vllm-load locustfile chat)\"")
    lp.add_argument("name", choices=LOCUSTFILES)
    op = sub.add_parser("options", help="every option of the locustfiles: default, environment variable, meaning "
                        "(Locust's --help cannot show them: it prints before the locustfile is imported)")
    op.add_argument("--search", default="", metavar="WORD",
                    help="only the options whose flag, group or meaning has WORD (case-insensitive), e.g. ttft")
    op.add_argument("--markdown", action="store_true",
                    help="docs/options.md's table (Markdown), as the docs hold it")
    sub.add_parser("native", help="which stream reader this install uses: the native receive thread (built from "
                   "C at install time) or the Python fallback, and why")
    args = ap.parse_args(argv)
    if args.cmd == "native":
        from vllm_load.client import native

        print(native.describe())
        return 0
    if args.cmd == "options":
        from vllm_load.option_docs import describe, markdown

        if args.markdown:
            print(markdown())
            return 0
        text = describe(args.search)
        if not text:
            print(f"vllm-load: error: no option mentions {args.search!r} (vllm-load options lists them all)",
                  file=sys.stderr)
            return 2
        print(text)
        return 0
    if args.cmd == "locustfile":
        print(Path(__file__).resolve().parent / "locustfiles" / f"{args.name}.py")
        return 0
    if args.cmd == "compare":
        from vllm_load.report.compare import render_console, run_compare

        try:
            c, out = run_compare(args.run_a, args.run_b, args.out, parse_share(args.threshold, "--threshold"))
        except UsageError as exc:
            sys.stderr.write(f"vllm-load: error: {exc}\n")
            return EXIT_BAD_INPUT
        except OSError as exc:  # RUN_B on a read-only mount: one line, not a traceback
            return _unwritable(exc, "the comparison", "give --out DIR somewhere writable")
        print(render_console(c))
        print(f"{out / 'compare.html'}")
        return 0
    from vllm_load.report.html import build
    from vllm_load.report.sweep import build_sweep

    try:
        codes = []
        for d in args.run_dirs:
            built = build(d, args.slo, args.junit if len(args.run_dirs) == 1 else "")
            print(f"{built.report}  (exit code {built.verdict.exit_code})")
            codes.append(built.verdict.exit_code)
        if len(args.run_dirs) > 1:
            out = Path(args.out or Path("reports") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}")
            print(build_sweep(args.run_dirs, out, args.slo)[0])
    except UsageError as exc:
        sys.stderr.write(f"vllm-load: error: {exc}\n")
        return EXIT_BAD_INPUT
    except OSError as exc:  # a run directory on a read-only mount: one line, not two tracebacks
        return _unwritable(exc, "the report", "copy the run directory somewhere writable and run vllm-load report "
                                              "on the copy")
    return max(codes)


def _unwritable(exc: OSError, what: str, advice: str) -> int:
    """A command's files could not be written: one line naming the file and the cause, exit 6 (as a run's)."""
    sys.stderr.write(f"vllm-load: error: {OutputError.of(exc, what, advice)}\n")
    return EXIT_OUTPUT


if __name__ == "__main__":
    sys.exit(main())
