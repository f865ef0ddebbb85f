"""Is the load generator itself the bottleneck, and if so why? Each worker measures (``client_monitor``), the
master judges (here).

Every second a load-generating process notes its CPU use (psutil), how late a 1 s gevent timer fires
(event-loop lag: what every stream's timing suffers), the streams it holds, and the evidence that tells
the causes of a lag apart: how long its event-loop thread sat runnable but waiting for a CPU (the
kernel's run delay, ``/proc/self/schedstat``) and the host's steal time. With each Locust report it
ships the maxima since the last one.

A run is marked untrustworthy when a worker sat at >= 90 % CPU for two reports in a row, its loop
lagged by 50 ms or more, its reader read a chunk 5 ms or more after it landed, or (open loop)
requests left 50 ms or more later than planned at p99. The
advice follows the evidence: a client at its CPU limit needs more workers; a loop that lagged while its
own CPU was low and the kernel kept it waiting for a CPU (or the hypervisor stole it) was crowded out by
another process on the same cores (a server on the load host, say: more processes there make it worse);
a lag with neither is the client blocking its own loop (a blocking call in a user's task).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from vllm_load.metric_table import ITL, SEND_LAG, SEND_LAG_STARTUP
from vllm_load.metrics.summary import RunSummary, metric_stats
from vllm_load.metrics.summary_parts import ClientVerdict

CPU_LIMIT = 90.0
LAG_LIMIT = 0.050
SEND_LAG_LIMIT = 0.050
#: A lag is another process's doing when, in the second it happened, the loop thread spent at least this
#: share of the lag runnable but waiting for a CPU. (A quiet run on 2 cores shared with the emulator and the
#: prompt thread waits up to 60-80 ms in its busiest second with < 1 ms of lag, so the wait alone says
#: nothing; a blocked loop waits ~0 while it lags.)
CONTENTION_SHARE = 0.5
#: The reader (native or Python) read a segment this long after it landed: a stream's next chunk, due within that
#: time, may have been merged into it by the kernel (one stamp for two chunks), the bound on a gap's error
READ_LAG_LIMIT = 0.005
STEAL_LIMIT = 10.0
#: late reads count against the run when this share of chunk gaps read 0 (one in a thousand moves p99.9)
SHARED_LIMIT = 0.001
#: a late read is others' doing when the loop's thread also waited this long for a CPU in that report's span
CONTENTION_WAIT_S = 0.1

#: causes, and what to do about each
ADVICE = {
    "client": "add workers: --processes N or more machines",
    "contention": "another process (e.g. a server on this host) competes for these cores: run the load "
                  "elsewhere or on other cores (more processes here make it worse)",
    "blocked": "the client's own loop was blocked (a blocking call in a user task, or a pause): see the log",
    "schedule": "add workers, or raise --max-concurrency",
    "cap": "every stream slot of --max-concurrency was busy, so arrivals waited for one: the server is slower than "
           "the offered rate allows at that cap: raise --max-concurrency, or lower --request-rate",
    "host": "the reader thread was not scheduled in time with this process's CPU low and no other process "
            "waiting: the host (a VM's vCPU, power saving) held it; measure on another host",
    "emulator": "the embedded emulator shares these cores with the client: lower the load, give it cores of its "
                "own, or measure a real server with --host",
}
def who_fell_behind(cause: str | None) -> str:
    """The headline of an untrustworthy run, naming what fell behind: the embedded emulator when its own lateness
    is the cause (the headline blamed the load generator while the cause below it named the emulator)."""
    if cause == "user_error":
        return "a user task raised in a loop, so the load generator could not keep time"
    return ("the embedded emulator fell behind its own schedule" if cause == "emulator"
            else "the load generator could not keep time")


#: a user task's exceptions take the blame for the client's lateness when there are at least this many and they
#: outnumber the requests made: a task that raises at once runs again at once (``self.llm.chat("hello")``, its
#: arguments wrong, raised 12,339 TypeErrors in 5 s and the verdict asked for more workers)
USER_ERRORS_MIN = 50
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def looping_errors(errors: list[tuple[int, str, str]], requests: int) -> tuple[int, str] | None:
    """``errors``: Locust's exception rows (count, message, traceback). The total and what the commonest says
    (its message and the task it came from) when they outnumber the requests, else None."""
    total = sum(count for count, _, _ in errors)
    if total < USER_ERRORS_MIN or total < requests:
        return None
    count, msg, tb = max(errors, key=lambda e: e[0])
    frames = [m for m in _FRAME.finditer(tb) if "/locust/" not in m[1] and "/vllm_load/" not in m[1]]
    where = f" in {frames[-1][3]} ({frames[-1][1].rsplit('/', 1)[-1]}:{frames[-1][2]})" if frames else ""
    return total, f"{msg!r}{where}, {count} times"


#: the embedded emulator fell behind when this share of its chunks came over 10 ms after their due time (a note
#: from EMULATOR_NOTE): its times then describe a starved emulator, not a slow server
EMULATOR_LATE = 0.05
EMULATOR_NOTE = 0.001


def emulator_finding(chunks: int | None, late: int | None) -> tuple[str | None, bool]:
    """What the embedded emulator's own lateness says (from the server series: its chunks produced on schedule
    and those over 10 ms late in the run's window), and whether it disowns the run's numbers."""
    if not chunks or late is None:
        return None, False
    share = late / chunks
    said = (f"the embedded emulator fell behind its own schedule: {late:.0f} of its {chunks:.0f} chunks ({share:.1%}) "
            "came over 10 ms late")
    if share >= EMULATOR_LATE:
        return said + " (it shares these cores): the times describe a starved emulator, not a slow server", True
    return (said, False) if share >= EMULATOR_NOTE else (None, False)


def silent_workers(summary: Mapping[str, Any]) -> str | None:
    """The sentence for workers Locust marked missing (no heartbeat for ~3 s) that came back, or None. Locust
    takes their users away while they are missing, and stops the test when every worker is."""
    summary = RunSummary.of(summary)
    lost = set(summary.workers_lost or [])
    silent = {w: t for w, t in (summary.workers_missing or {}).items() if w not in lost}
    if not silent:
        return None
    named = ", ".join(f"{w} ({t:.1f} s into the run)" for w, t in sorted(silent.items(), key=lambda kv: kv[1]))
    every = len(silent) >= len(summary.workers or silent)
    return (f"worker(s) sent no heartbeat for 3 s (their loop was blocked or their host starved) and Locust marked "
            f"them missing: {named}" + ("; with every worker missing Locust stopped the test" if every else ""))


def lag_cause(report: dict) -> str:
    """Why one report's loop lagged: 'client', 'contention' or 'blocked' (see the module's docstring)."""
    own = float(report.get("cpu_at_lag", report.get("cpu", 0.0)))
    if own >= CPU_LIMIT:
        return "client"
    if report.get("wait_at_lag", 0.0) >= CONTENTION_SHARE * report["lag"] or report.get("steal", 0.0) >= STEAL_LIMIT:
        return "contention"
    return "blocked"


def judged_send_lag(summary: Mapping[str, Any]) -> float | None:
    """The open loop's send lag p99 the verdict judges: the first 2 s of sends (a schedule's start) are left out,
    unless they are all there is (66 turns replayed in 1.1 s, the first 8 sent 175-186 ms late, were trusted for
    lying in that grace); None for a closed loop."""
    for key in (SEND_LAG, SEND_LAG_STARTUP):
        lag = metric_stats(summary, key)
        if lag.count:
            return lag.at("p99")
    return None


def shared_stamp(summary: Mapping[str, Any]) -> float:
    """The share of chunk gaps that were 0 (two chunks of a stream under one receive stamp)."""
    summary = RunSummary.of(summary)
    gaps = metric_stats(summary, ITL).count
    return (summary.shared_stamps or 0) / gaps if gaps else 0.0


def late_merged(summary: Mapping[str, Any]) -> float | None:
    """The share of chunk gaps that the native reader's late reads made 0 (None: a summary from before it was
    counted). A gap of 0 from an on-time read is the server's: it wrote the two chunks together."""
    summary = RunSummary.of(summary)
    if summary.late_merged_gaps is None:
        return None
    gaps = metric_stats(summary, ITL).count
    return summary.late_merged_gaps / gaps if gaps else 0.0


def read_cause(report: dict) -> str:
    """Why the reader read late, from the same report's evidence: its own CPU at the limit ('client'), others
    on these cores or the VM's steal ('contention'), else the reader thread's own scheduling ('host')."""
    if float(report.get("cpu", 0.0)) >= CPU_LIMIT:
        return "client"
    if report.get("wait", 0.0) >= CONTENTION_WAIT_S or report.get("steal", 0.0) >= STEAL_LIMIT:
        return "contention"
    return "host"


@dataclass
class ClientHealth:
    """Kept by the master (or the local runner): every worker's reports, and the verdict."""

    reports: dict = field(default_factory=dict)  # worker -> list of monitor reports

    def add(self, worker: str, report: dict) -> None:
        self.reports.setdefault(worker, []).append(report)

    def judge(self, summary: RunSummary, errors: list[tuple[int, str, str]],
              quiet: list[tuple[float, float]] | None = None, cap: int = 0) -> ClientVerdict:
        """The verdict on a run's summary, as the end and the web UI's live view both give it: its judged send lag,
        its stamps, and Locust's exception rows (``errors``) naming a task that raises in a loop."""
        return self.verdict(judged_send_lag(summary), quiet, shared_stamp=shared_stamp(summary),
                            late_merged=late_merged(summary), cap=cap,
                            user_errors=looping_errors(errors, summary.requests))

    def verdict(self, send_lag_p99: float | None = None, quiet: list[tuple[float, float]] | None = None,
                shared_stamp: float = 1.0, late_merged: float | None = None, cap: int = 0,
                user_errors: tuple[int, str] | None = None) -> ClientVerdict:
        """``quiet``: spans (wall clock) of outages and failure storms, whose reports are not judged.
        ``shared_stamp``: the share of chunk gaps that were 0 (two chunks of a stream under one stamp). A late
        read can move a measured gap only by merging a stream's chunks under one stamp, and a percentile only
        when enough gaps moved: below SHARED_LIMIT (0.1 %, what p99.9 resolves) late reads are reported in
        ``notes``, not held against the run (README command 1 was flagged for 13 reads of 22,443, at most
        9.8 ms late, that merged nothing; a 3 s test run for one 6.9 ms read that merged a few chunks).
        ``late_merged``: the share of gaps the native reader's late reads made 0, judged instead for that reader:
        gaps of 0 that landed together are the server's (a 256-stream GPU-like benchmark run had 27.9 % of its
        gaps at 0 from an emulator that wrote chunks in bursts, and was failed for 10 late reads of 142,986)."""
        reasons: list[str] = []
        causes: list[str] = []
        notes: list[str] = []
        quiet_late: list[tuple[str, float, str]] = []  # late reads too few to matter: (worker, worst, its note)
        for worker, all_rows in sorted(self.reports.items()):
            # a report covers the 3 s before its stamp; reports without one (older) always count
            rows = [r for r in all_rows if not any(a <= r.get("t", -1e18) <= b + 3.0 for a, b in quiet or [])]
            hot = [r["cpu"] >= CPU_LIMIT for r in rows]
            if any(a and b for a, b in zip(hot, hot[1:])):
                reasons.append(f"{worker}: CPU at or above {CPU_LIMIT:.0f}% for two reports in a row")
                causes.append("client")
            # with the native reader a late loop moves no chunk's time, but it still sends late: the load
            # offered (concurrency, arrivals) was not what was asked, so a lag is judged for both readers
            worst = max(rows, key=lambda r: r["lag"], default=None)
            if worst is not None and worst["lag"] >= LAG_LIMIT:
                cause = lag_cause(worst)
                reasons.append(
                    f"{worker}: event loop lagged {worst['lag'] * 1000:.0f} ms (own CPU "
                    f"{worst.get('cpu_at_lag', worst['cpu']):.0f}%, waited {worst.get('wait_at_lag', 0.0) * 1000:.0f} "
                    f"ms for a CPU in that second, steal {worst.get('steal', 0.0):.0f}%)")
                causes.append(cause)
            late = max(rows, key=lambda r: r.get("read_lag", 0.0), default=None)
            if late is not None and late.get("read_lag", 0.0) >= READ_LAG_LIMIT:
                said = (f"{worker}: the {late.get('reader', 'native')} reader read a chunk {late['read_lag'] * 1000:.1f} "
                        f"ms after it landed ({sum(r.get('late_reads', 0) for r in rows)} of "
                        f"{sum(r.get('reads', 0) for r in rows)} reads later than 1 ms; own CPU {late['cpu']:.0f}%, "
                        f"waited {late.get('wait', 0.0) * 1000:.0f} ms for a CPU, steal {late.get('steal', 0.0):.0f}%)")
                if late.get("reader", "native") == "native" and late_merged is not None:
                    share = late_merged
                    what = f"late reads merged {share:.2%} of chunk gaps into 0 (two chunks under one stamp)"
                    why = what
                else:
                    share = shared_stamp
                    what = f"{share:.2%} of chunk gaps read 0"
                    why = what + " (chunks under one stamp, which a late read makes)"
                if share >= SHARED_LIMIT:
                    reasons.append(f"{said}: {why}: enough to move p99.9")
                    causes.append(read_cause(late))
                else:
                    quiet_late.append((worker, late["read_lag"], f"{said}: {what}, too few to move any percentile "
                                                                   "reported"))
        if len(quiet_late) > 2:  # a swarm's many workers: one line, not one per worker (32 workers gave 18 lines)
            worst = max(quiet_late, key=lambda q: q[1])
            notes.append(f"{len(quiet_late)} of {len(self.reports)} workers read a chunk late (at most "
                         f"{worst[1] * 1000:.1f} ms after it landed), too few to move any percentile reported; the "
                         f"worst: {worst[2]}")
        else:
            notes += [q[2] for q in quiet_late]
        all_rows = [r for rows in self.reports.values() for r in rows]
        if send_lag_p99 is not None and send_lag_p99 >= SEND_LAG_LIMIT:
            reason, cause = self._send_lag(send_lag_p99, all_rows, cap)
            reasons.append(reason)
            causes.append(cause)
        # the most specific cause decides the advice: contention explains a lagging schedule too
        order = ("contention", "client", "blocked", "host", "cap", "schedule")
        cause = next((c for c in order if c in causes), None)
        advice = ADVICE[cause] if cause else ""
        if reasons and user_errors is not None:  # ``looping_errors``: the user's task, not the client's capacity
            cause, advice = "user_error", (f"user tasks raised {user_errors[0]} exceptions, more than the requests "
                                           f"made (the commonest: {user_errors[1]}): a task that raises runs again at "
                                           "once and holds the CPU: fix the task")
        return ClientVerdict({
            "saturated": bool(reasons),
            "reasons": reasons,
            "notes": notes,
            "cause": cause,
            "advice": advice,
            "cpu_max": max((r["cpu"] for r in all_rows), default=0.0),
            "loop_lag_max": max((r["lag"] for r in all_rows), default=0.0),
            "cpu_wait_max": max((r.get("wait", 0.0) for r in all_rows), default=0.0),
            "steal_max": max((r.get("steal", 0.0) for r in all_rows), default=0.0),
            "streams_max": max((r["streams"] for r in all_rows), default=0),
            # which readers timed the chunks: "native" (a C thread reads each chunk as it lands), "python" (kernel
            # stamps, exact while the loop keeps up; see client/native.py), "clock" (TLS: no kernel stamp)
            "readers": sorted({x for r in all_rows for x in (r.get("readers") or [r["reader"]] if "reader" in r
                                                              else [])}),
            "read_lag_max": max((r.get("read_lag", 0.0) for r in all_rows), default=0.0),
        })

    def _send_lag(self, p99: float, rows: list[dict], cap: int) -> tuple[str, str]:
        """An open loop's late sends, with the evidence over the run that tells their cause: a worker's own CPU at
        its limit, others on these cores (the loop's wait for a CPU, the VM's steal), every stream slot busy."""
        cpu = max((r["cpu"] for r in rows), default=0.0)
        wait = max((r.get("wait", 0.0) for r in rows), default=0.0)
        steal = max((r.get("steal", 0.0) for r in rows), default=0.0)
        # each worker's peak; summed, the most the swarm can have held at once
        streams = sum(max((r["streams"] for r in worker), default=0) for worker in self.reports.values())
        said = (f"open loop: requests left {p99 * 1000:.0f} ms late at p99 (peak own CPU {cpu:.0f}%, waited up to "
                f"{wait * 1000:.0f} ms for a CPU in a second, steal {steal:.0f}%"
                + (f", at most {streams} of {cap} stream slots in flight)" if cap else ")"))
        if cpu >= CPU_LIMIT:
            return said, "client"
        if wait >= CONTENTION_WAIT_S or steal >= STEAL_LIMIT:
            return said, "contention"
        return said, "cap" if cap and streams >= cap else "schedule"
