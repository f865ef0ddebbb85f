"""`vllm-load tune`: find the server configuration that carries the most load within the SLOs.

For each configuration of the grid: start the server from the --serve template (its own process group, its
log in the output directory), wait until it serves, start a sidecar beside it, search its capacity with
normal measured probes (warm-up excluded), stop it; then recommend the configuration with the most goodput
and say why each other one lost. Without --serve, the same search runs against one running server (--host).

    vllm-load tune --serve 'vllm serve M --port {port} --max-num-seqs {max_num_seqs}' \\
        --grid max_num_seqs=64,128,256 --slo 'ttft.p99<=2s' --out tune-1 -- -f locustfiles/chat.py --input-tokens 512
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import signal
import sys
import time
from pathlib import Path

from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_SLO_MISS, EXIT_UNTRUSTWORTHY, UsageError
from vllm_load.metrics.judge.recipes import parse_recipe, with_recipe
from vllm_load.metrics.judge.slo import parse_slo_option
from vllm_load.workload.lengths import parse_duration
from vllm_load.tune.probe import Probe, combine, run_probe
from vllm_load.tune.report import label, rate_text, trust_note, why_lost, write
from vllm_load.tune.search import CapacitySearch
from vllm_load.tune.server import ServerProcess, free_port, render
from vllm_load.tune.children import Stopped, installed, spawning


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option with its default (none said for an empty one: it showed "(default: )"); the examples as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in ("", None, [], ()) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vllm-load tune", description=__doc__.splitlines()[0],
        formatter_class=_Help,
        epilog="After --: the options of a normal run, passed to every probe as they are.\n\nexample (a --serve'd emulator, tuning its "
        "max_num_seqs, 8 s probes):\n  vllm-load tune --serve 'vllm-load-emulator --port {port} "
        "--profile cpu-tiny --max-num-seqs {max_num_seqs}' \\\n      --grid max_num_seqs=2,4 --slo 'ttft.p99<=500ms' --probe-duration 8s "
        "--probe-warmup 2s \\\n      -- --output-tokens 64\nexample (a running server):\n  vllm-load tune --host "
        "http://HOST:8000 --slo 'ttft.p99<=500ms' --search rate")
    ap.add_argument("--serve", default="", help="the server's command, with {port} and each grid parameter as "
                    "{name}; without it, --host names one running server to search")
    ap.add_argument("--host", default="", help="without --serve: the running server to search")
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,…",
                    help="a parameter and its values (repeatable: the Cartesian product is tuned)")
    ap.add_argument("--grid-file", default="", help="a JSON list of parameter dicts (vllm bench sweep's --serve-params)")
    ap.add_argument("--slo", action="append", default=[], help="the SLOs every probe is judged by (as a run's --slo)")
    ap.add_argument("--recipe", default="", help="a named search: 'max-goodput[:90%%]' (the most load at which that "
                    "share of the requests met every per-request --slo limit; as a run's --recipe)")
    ap.add_argument("--out", default="", help="output directory (default: reports/tune-<time>)")
    ap.add_argument("--search", choices=("concurrency", "rate"), default="concurrency",
                    help="search users (closed loop) or request rate (open loop)")
    ap.add_argument("--start-level", type=float, default=1.0, help="the first probe's users or req/s")
    ap.add_argument("--max-level", type=float, default=1024.0, help="the search grows no further")
    ap.add_argument("--search-tolerance", default="10%", help="bisect until the gap is within this share of it")
    ap.add_argument("--probe-duration", default="30s", help="each probe's length, warm-up included")
    ap.add_argument("--probe-warmup", default="5s", help="each probe's first seconds, left out of its numbers")
    ap.add_argument("--rate-users", type=int, default=32, help="--search rate: users the rate is split over")
    ap.add_argument("--server-ready-timeout", default="10m", help="how long a server may take to serve")
    ap.add_argument("--resume", action="store_true", help="skip configurations already measured in --out")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="probe each level N times: it passes when "
                    "every repeat passed, its numbers are their means with a confidence interval (--confidence)")
    ap.add_argument("--confidence", type=float, default=0.95, help="the confidence of --repeat's intervals")
    return ap


def configurations(grid: list[str], grid_file: str) -> list[dict]:
    if grid_file:
        try:
            data = json.loads(Path(grid_file).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--grid-file {grid_file} cannot be read as JSON ({exc})") from None
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise UsageError(f"--grid-file {grid_file} must hold a JSON list of parameter dicts")
        return [dict(d) for d in data] or [{}]
    axes = []
    for g in grid:
        name, sep, values = g.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()) or not vals:
            raise UsageError(f"--grid {g!r} is not NAME=V1,V2,…: write e.g. --grid max_num_seqs=64,128")
        axes.append([(name.strip(), v) for v in vals])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def slug(params: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label(params).replace(",", "_")) if params else "as-served"


def tune(args: argparse.Namespace, locust_args: list[str]) -> int:
    if not args.serve and not args.host:
        raise UsageError("give --serve 'CMD … {port} …' (a server per configuration) or --host URL (one running server)")
    recipe = parse_recipe(args.recipe)
    slos = [s.text for s in parse_slo_option(with_recipe(recipe, args.slo))] if args.slo else []
    if not slos:  # none given, or a file or value that holds none
        raise UsageError("give the SLOs the capacity is judged by: --slo 'ttft.p99<=2s' (repeatable, or a file)")
    tol_text = args.search_tolerance.strip().rstrip("%")
    try:
        tolerance = float(tol_text) / (100 if args.search_tolerance.strip().endswith("%") else 1)
    except ValueError:
        raise UsageError(f"--search-tolerance {args.search_tolerance!r} is not a share, e.g. 10%") from None
    if not 0 < tolerance < 1 or args.start_level <= 0 or args.max_level < args.start_level:
        raise UsageError("--search-tolerance must be between 0% and 100%, --start-level > 0 and --max-level >= it")
    duration, warmup = parse_duration(args.probe_duration, "--probe-duration"), parse_duration(
        args.probe_warmup, "--probe-warmup")
    ready = parse_duration(args.server_ready_timeout, "--server-ready-timeout")
    if duration <= warmup:
        raise UsageError("--probe-duration must be longer than --probe-warmup")
    if args.repeat < 1 or not 0 < args.confidence < 1:
        raise UsageError(f"--repeat must be 1 or more (got {args.repeat}) and --confidence between 0 and 1 "
                         f"(got {args.confidence:g})")
    if not any(a in ("-f", "--locustfile") or a.startswith("--locustfile=") for a in locust_args):
        locust_args = ["-f", str(Path(__file__).resolve().parent.parent / "locustfiles" / "chat.py"), *locust_args]
    configs = configurations(args.grid, args.grid_file)
    if args.serve:
        for params in configs:
            render(args.serve, params, 0)  # a template naming an unknown parameter fails now, not mid-tune
    out = Path(args.out or Path("reports") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for n, params in enumerate(configs, 1):
        cdir = out / slug(params)
        done = cdir / "result.json"
        if args.resume and done.exists():
            results.append(json.loads(done.read_text()))
            print(f"vllm-load tune: [{n}/{len(configs)}] {label(params)}: measured before, kept (--resume)", flush=True)
            continue
        print(f"vllm-load tune: [{n}/{len(configs)}] {label(params)}", flush=True)
        result = tune_one(args, params, cdir, locust_args, slos, tolerance, duration, warmup, ready)
        done.write_text(json.dumps(result, indent=1))
        results.append(result)
        cap = "none" if result["capacity"] is None else f"{result['capacity']:g}"
        print(f"vllm-load tune: {label(params)}: {result['status']}, capacity {cap} "
              f"({len(result['probes'])} probes){'' if result['status'] == 'ok' else ': ' + result['reason']}",
              flush=True)
    best = write(out, results, args.search, slos, figures="--no-figures" not in locust_args)
    if best is None:
        print(f"vllm-load tune: no configuration met the SLOs ({out / 'tune.md'})", flush=True)
        return EXIT_SLO_MISS
    note = trust_note(best)
    print(f"vllm-load tune: {'best measured (not recommended)' if note else 'recommended'} {label(best['params'])}: "
          f"capacity {best['capacity']:g}, goodput "
          f"{best['goodput']:.2f} good req/s" + (f". WARNING: {note}" if note else ""), flush=True)
    if recipe is not None:
        print(f"vllm-load tune: {recipe.headline(args.search, format(best['capacity'], 'g'), best['goodput'])} "
              f"({label(best['params'])})", flush=True)
    for r in results:
        if r is not best:
            print(f"  {label(r['params'])}: {why_lost(r)}", flush=True)
    print(f"vllm-load tune: {out / 'tune.html'}", flush=True)
    # a best measured on untrustworthy probes is no recommendation: a gate on the tune fails as on such a run
    return EXIT_UNTRUSTWORTHY if note else EXIT_OK


def tune_one(args: argparse.Namespace, params: dict, cdir: Path, locust_args: list[str], slos: list[str],
             tolerance: float, duration: float, warmup: float, ready: float) -> dict:
    result: dict = {"params": params, "status": "ok", "reason": "", "capacity": None, "goodput": None, "probes": []}
    server = None
    sidecar = None
    cdir.mkdir(parents=True, exist_ok=True)  # the sidecar writes its series here (with --host, nothing else made it)
    try:
        if args.serve:
            port = free_port()
            server = ServerProcess(render(args.serve, params, port), f"http://127.0.0.1:{port}", cdir / "server.log")
            why = server.start(ready)
            if why:
                result.update(status="failed", reason=why)
                return result
            url = server.url
        else:
            url = args.host
        from vllm_load.runtime.embedded import start_sidecar

        with spawning():  # a signal now would leave the sidecar started and not yet held
            sidecar = start_sidecar(url, cdir / "server-series.jsonl")
        search = CapacitySearch(start=args.start_level, max_level=args.max_level, tolerance=tolerance,
                                integer=args.search == "concurrency")
        while (level := search.next_level()) is not None:
            probe = probe_level(args, locust_args, url, level, slos, sidecar.url, duration, warmup, cdir)
            search.record(level, probe.passed)
            result["probes"].append(probe.to_json())
            print(f"vllm-load tune:   {level:g} {'users' if args.search == 'concurrency' else 'req/s'}: "
                  f"{'pass' if probe.passed else 'MISS'}{repeats_text(probe, args.repeat)} "
                  f"({rate_text(probe.spread.get('request_rate'), probe.request_rate, 2)} req/s, "
                  f"{rate_text(probe.spread.get('output_token_rate'), probe.output_token_rate, 0)} tok/s)"
                  + (f" UNTRUSTWORTHY: {probe.untrustworthy}" if probe.untrustworthy else "")
                  + (f" TOO SHORT: {probe.short}" if probe.short else ""), flush=True)
            crash = server.crashed() if server else None
            if crash:
                result.update(status="failed", reason=crash)
                return result
        result["capacity"] = search.capacity
        at = [p for p in result["probes"] if p["passed"] and p["level"] == search.capacity]
        result["goodput"] = at[0]["goodput"] if at else None
        result["goodput_spread"] = (at[0].get("spread") or {}).get("goodput") if at else None  # --repeat
        if search.capacity is None:
            result.update(status="none", reason="even the first level missed an SLO")
        return result
    finally:
        if sidecar is not None:
            sidecar.stop()
        if server is not None:
            server.stop()


def probe_level(args: argparse.Namespace, locust_args: list[str], url: str, level: float, slos: list[str],
                sidecar_url: str, duration: float, warmup: float, cdir: Path) -> Probe:
    """One level, probed --repeat times (each in its own run directory); a repeat that misses ends the level.

    A miss whose run disowned its own numbers (the client could not keep time: a busy host starved it or the server
    beside it; or a start so slow on a busy host that its -t passed before a request was measured: 3.7 s of a 3 s
    probe) says nothing about the server, yet it would end the growth there, or leave a configuration with no
    capacity at all: such a try is run once more, and the second one counts (named ``reprobed``, its first run's
    directory kept beside it)."""
    def once(where: Path) -> Probe:
        return run_probe(locust_args, url, level, args.search, slos, sidecar_url, f"{duration:g}s", f"{warmup:g}s",
                         where, args.rate_users, timeout=duration + 300)

    probes: list[Probe] = []
    for k in range(1, args.repeat + 1):
        run_dir = cdir / (f"probe-{level:g}" if args.repeat == 1 else f"probe-{level:g}-r{k}")
        probe = once(run_dir)
        if not probe.passed and probe.untrustworthy:  # measured nothing, or missed, while starved: once more
            why = probe.untrustworthy
            print(f"vllm-load tune:   {level:g}: missed while its client was untrustworthy ({why}): probing it "
                  "once more", flush=True)
            probe = once(run_dir.with_name(run_dir.name + "-again"))
            probe.reprobed = why
        probes.append(probe)
        if not probe.passed:
            break
    return combine(probes, args.confidence)


def repeats_text(probe: Probe, asked: int) -> str:
    """How many of the asked repeats ran and passed ('' without --repeat)."""
    if asked == 1:
        return ""
    n = len(probe.repeats) or 1
    passed = sum(1 for r in probe.repeats if r["passed"]) if probe.repeats else int(probe.passed)
    return f" ({passed} of {n} repeats passed" + ("" if n == asked else f", of {asked} asked") + ")"


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        ours, locust_args = argv[:i], argv[i + 1:]
    else:
        ours, locust_args = argv, []
    args = parser().parse_args(ours)
    try:
        with installed():
            return tune(args, locust_args)
    except UsageError as exc:
        sys.stderr.write(f"vllm-load: error: {exc}\n")
        return EXIT_BAD_INPUT
    except (KeyboardInterrupt, Stopped) as exc:  # the probe and the server were stopped on the way out
        sig = "SIGTERM" if isinstance(exc, Stopped) else "SIGINT"
        sys.stderr.write(f"vllm-load tune: stopped by {sig}: the probe under way and the server it started were "
                         "stopped; --resume goes on from the configurations already measured\n")
        return 128 + (signal.SIGTERM if isinstance(exc, Stopped) else signal.SIGINT)
