"""``vllm-load history``: list the runs of the results store, show one metric's series with its change points,
import run directories, and write the history page.

    vllm-load history list [--label commit=abc] [--limit 20]
    vllm-load history show ttft.p99 [--fingerprint FP | --run RUN_ID]
    vllm-load history import reports/            # every run directory under it
    vllm-load history page --out history.html

The store is ``--results-db`` (or VLLM_LOAD_RESULTS_DB), else ``reports/history.sqlite``, as a run records it."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from vllm_load.metric_table import BY_KEY
from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OUTPUT, UsageError
from vllm_load.features.history import parse_labels
from vllm_load.history.query import parse_metric, series
from vllm_load.history.record import of_run_dir
from vllm_load.history.store import DEFAULT_FILE, Store, describe
from vllm_load.rundir.files import holds_a_run

#: what `import` says of its progress, every this many runs
PROGRESS_EVERY = 50


def _since(text: str) -> float:
    if not text:
        return 0.0
    m = re.match(r"^(\d+(?:\.\d+)?)\s*([smhd])$", text.strip())
    if m:
        return time.time() - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since {text!r}: give a date (2026-12-01, 2026-12-01T08:00) or an age (7d, 12h)") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-load history", description="the results store: every run, its "
                                 "metrics' series across runs and their change points")
    ap.add_argument("--results-db", default=os.environ.get("VLLM_LOAD_RESULTS_DB", ""),
                    help=f"the store: a file (SQLite) or postgresql://USER@HOST/DB (default: reports/{DEFAULT_FILE})")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--label", action="append", default=[], help="only runs with this label, KEY=VALUE (repeatable)")
        p.add_argument("--fingerprint", default="", help="only runs of this load fingerprint")
        p.add_argument("--run", default="", help="only runs of the load of this run (its fingerprint)")
        p.add_argument("--since", default="", help="only runs started since: a date (2026-12-01) or an age (7d)")

    lp = sub.add_parser("list", help="the runs, newest first")
    filters(lp)
    lp.add_argument("--limit", type=int, default=20, help="at most this many (0: all; default 20)")
    lp.add_argument("--json", action="store_true", help="as JSON lines")
    sp = sub.add_parser("show", help="one metric's series across comparable runs, with its change points",
                        epilog="example: vllm-load history show ttft.p99")
    sp.add_argument("metric", help="METRIC[.STAT]: ttft.p99, e2e.mean, output_token_rate, server.preemptions")
    filters(sp)
    sp.add_argument("--json", action="store_true", help="the series and change points as JSON")
    ip = sub.add_parser("import", help="record existing run directories (or the run directories under a folder)")
    ip.add_argument("paths", nargs="+", help="run directories, or folders holding them")
    ip.add_argument("--label", action="append", default=[], help="add this label to each, KEY=VALUE (repeatable)")
    pp = sub.add_parser("page", help="write the history page (HTML): a chart per metric, each run a point")
    filters(pp)
    pp.add_argument("--metric", action="append", default=[], help="the metrics charted (default: TTFT p99, "
                    "ITL p99, E2E p99, output tokens/s)")
    pp.add_argument("--out", default="", help="where the page goes (default: history.html beside the store)")
    return ap


def _url(args: argparse.Namespace) -> str:
    return args.results_db or str(Path("reports") / DEFAULT_FILE)


def _fingerprint(store: Store, args: argparse.Namespace) -> str:
    if args.run:
        rows = store.runs(run_id=args.run)
        if not rows:
            raise UsageError(f"--run {args.run}: no such run in {describe(store.url)}")
        return str(rows[0]["fingerprint"])
    return str(args.fingerprint or "")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        url = _url(args)
        if args.cmd != "import" and "://" not in url and not Path(url).exists():
            raise UsageError(f"no results store at {url}: a run records itself there (or give --results-db; "
                             "vllm-load history import RUN_DIR… fills one)")
        with Store.open(url) as store:
            return {"list": _list, "show": _show, "import": _import, "page": _page}[args.cmd](store, args)
    except UsageError as exc:
        sys.stderr.write(f"vllm-load: error: {exc}\n")
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `vllm-load history list | head`: the reader had enough
        return 0
    except OSError as exc:
        sys.stderr.write(f"vllm-load: error: {exc.filename or ''} {exc.strerror or exc}\n")
        return EXIT_OUTPUT


def _list(store: Store, args: argparse.Namespace) -> int:
    rows = store.runs(_fingerprint(store, args), parse_labels(args.label), _since(args.since),
                      limit=max(0, args.limit), newest_first=True)
    if args.json:
        for r in rows:
            print(json.dumps(r, sort_keys=True))
        return 0
    print(f"{store.count()} runs in {describe(store.url)}; the newest {len(rows)}:")
    print(f"{'run':<24} {'started (UTC)':<19}  {'fingerprint':<16} {'exit':>4} {'trust':<9} {'requests':>8}  labels")
    for r in rows:
        labels = " ".join(f"{k}={v}" for k, v in sorted(r["labels"].items()))
        print(f"{r['run_id']:<24} {_when(r['started']):<19}  {r['fingerprint']:<16} {r['exit_code']:>4} "
              f"{'trusted' if r['trusted'] else 'UNTRUSTED':<9} {r['requests']:>8}  {labels}")
    return 0


def _show(store: Store, args: argparse.Namespace) -> int:
    metric, stat = parse_metric(args.metric)
    found = series(store, metric, stat, _fingerprint(store, args), parse_labels(args.label), _since(args.since))
    if not found["points"]:
        raise UsageError(f"no run of {'load ' + found['fingerprint'] if found['fingerprint'] else 'the store'} "
                         f"measured {args.metric} (vllm-load history list shows the runs)")
    if args.json:
        print(json.dumps(found, sort_keys=True))
        return 0
    at = {c["run_id"]: c for c in found["changes"]}
    shown = BY_KEY.get(metric) if stat else None  # a per-request metric in its unit (ms); a figure as it is
    print(f"{args.metric} of load {found['fingerprint']}: {len(found['points'])} runs, "
          f"{len(found['changes'])} change point{'s' if len(found['changes']) != 1 else ''}")
    for p in found["points"]:
        value = f"{p['value'] * shown.scale:.2f} {shown.unit}" if shown else f"{p['value']:.4g}"
        mark = ""
        if p["run_id"] in at:
            c = at[p["run_id"]]
            mark = f"  <- CHANGE {c['shift'] * 100:+.1f} % (p={c['p_value']:.2g})"
        trust = "" if p["trusted"] and p["valid"] else "  (untrusted: not in the statistics)"
        print(f"  {p['run_id']:<24} {_when(p['started'])}  {value:>12}{trust}{mark}")
    return 0


def run_dirs(paths: list[str]) -> list[Path]:
    """The run directories named, or found one or two levels under a folder (reports/, reports/*/steps/ not)."""
    out: list[Path] = []
    for text in paths:
        p = Path(text)
        if not p.exists():
            raise UsageError(f"{text}: no such directory")
        if holds_a_run(p):
            out.append(p)
            continue
        found = sorted(d for d in p.iterdir() if d.is_dir() and holds_a_run(d))
        if not found:
            raise UsageError(f"{text} holds no run directory (config.json, summary.json)")
        out += found
    return out


def _import(store: Store, args: argparse.Namespace) -> int:
    labels = parse_labels(args.label)
    dirs = run_dirs(args.paths)
    new = old = 0
    skipped: list[str] = []
    for i, d in enumerate(dirs, 1):
        try:
            rec = of_run_dir(d, labels)
        except UsageError as exc:  # an unfinished run (no summary.json): said, the rest imported
            skipped.append(f"{d}: {exc}")
            continue
        if store.record(rec):
            new += 1
        else:
            old += 1
        if i % PROGRESS_EVERY == 0:
            sys.stderr.write(f"vllm-load: history import: {i} of {len(dirs)} run directories\n")
    for line in skipped:
        sys.stderr.write(f"vllm-load: history import: skipped {line}\n")
    print(f"{new} runs recorded, {old} already there, {len(skipped)} skipped: {store.count()} runs in "
          f"{describe(store.url)}")
    return EXIT_BAD_INPUT if skipped and not new and not old else 0


def _page(store: Store, args: argparse.Namespace) -> int:
    from vllm_load.history.page import write_page

    out = Path(args.out) if args.out else (Path(store.url).resolve().parent / "history.html" if "://" not in
                                           store.url else Path("history.html"))
    write_page(store, out, args.metric, _fingerprint(store, args), parse_labels(args.label), _since(args.since))
    print(out)
    return 0
