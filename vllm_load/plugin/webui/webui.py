"""The "LLM" tab of Locust's web UI: exact LLM percentiles and live output tokens/s."""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any, Callable

from vllm_load.metrics.shape.breakdown import tail_lines
from vllm_load.metrics.judge.client_health import who_fell_behind
from vllm_load.features import FEATURES
from vllm_load.metrics.summary import RunSummary
from vllm_load.report.console import COLUMNS, NAME_HEAD, name_rows, server_cells, table_rows


#: the badge's width follows the header: Locust's block on the right (host, status, users, and while a run goes
#: the edit/stop/reset buttons) starts ~465 px from the left at 1,400 px during a run, against ~880 px idle; a fixed
#: width overlapped its Host and Status labels then (at 1,000 px the block starts left of the badge: no room). Too little
#: room: hidden; the LLM tab's first row names the target too
BADGE_FIT = """(() => {
  const LEFT = 230, GAP = 12, PAD = 20;
  let need = 200;
  const fit = () => {
    const badge = document.getElementById('vllm-load-target');
    const header = document.querySelector('header');
    if (!badge || !header) return;
    let room = window.innerWidth - LEFT - GAP;
    for (const e of header.querySelectorAll('p, span, button, a, svg, img')) {
      if (badge.contains(e)) continue;
      const r = e.getBoundingClientRect();
      if (r.width > 0 && r.right > LEFT) room = Math.min(room, r.left - LEFT - GAP);  // the logo ends before LEFT
    }
    // its links never elide (the target's text does): shown only where they fit whole
    const links = badge.querySelector('.vllm-load-links');
    if (links && links.offsetWidth) need = links.offsetWidth + PAD + 40;
    badge.style.maxWidth = Math.max(0, room - PAD) + 'px';
    badge.style.display = room < need ? 'none' : 'flex';
  };
  fit();
  setInterval(fit, 300);
})();"""

#: Locust's Charts tab gets the LLM charts under its own (TTFT, ITL, output tok/s, the server: the live page, framed
#: by its own origin) while the tab is shown; Locust's UI offers tables and CSV files to plugins, no charts
CHARTS_TAB = """(() => {
  const sync = () => {
    const tab = [...document.querySelectorAll('[role=tab]')].find(t => t.getAttribute('aria-selected') === 'true');
    const shown = document.getElementById('vllm-load-charts');
    const main = document.querySelector('main .MuiContainer-root');
    if (!tab || tab.textContent !== 'Charts' || !main || !main.querySelector('canvas')) {
      if (shown) shown.remove();
      return;
    }
    if (shown && shown.parentElement === main) return;
    if (shown) shown.remove();
    const box = document.createElement('div');
    box.id = 'vllm-load-charts';
    box.innerHTML = "<h3 style='font:600 16px sans-serif;margin:24px 0 8px'>LLM metrics (vllm-load: exact, 10 s windows)</h3>"
      + "<iframe src='./vllm-load/live' title='vllm-load live LLM charts' "
      + "style='width:100%;height:1500px;border:0'></iframe>";
    main.appendChild(box);
  };
  setInterval(sync, 500);
})();"""


#: Locust's tables draw a cell's value as text: the LLM tab's paths to the live charts and the report become links
#: (React keeps the cell's own text node, emptied; a row that moves brings its new text there, and the link goes)
LINK_CELLS = """(() => {
  const PATH = /^\\/vllm-load\\/(live|report)$/;
  const link = () => {
    for (const td of document.querySelectorAll('td')) {
      const own = [...td.childNodes].filter(n => n.nodeType === 3);
      const text = own.map(n => n.nodeValue).join('');
      const a = td.querySelector('a.vllm-load-cell');
      if (a && text) a.remove();
      if (PATH.test(text)) {
        own.forEach(n => { n.nodeValue = ''; });
        const made = document.createElement('a');
        made.className = 'vllm-load-cell';
        made.href = '.' + text;
        made.target = '_blank';
        made.textContent = text;
        td.appendChild(made);
      }
    }
  };
  setInterval(link, 500);
})();"""

#: Locust's UI polls its stats only while a run spawns or runs: a tab open through the stop kept the numbers of the
#: last poll, mid-drain (386.5 tok/s against the report's 413.3). A page that showed a run reloads once the run's
#: judged numbers are in, and then shows them on every tab
FINAL_TURN = """(() => {
  let live = false;
  const look = () => fetch('./vllm-load/state', {credentials: 'same-origin'}).then(r => r.json()).then(s => {
    if (!s.final) live = live || s.state !== 'ready';
    else if (live && s.state === 'stopped') location.reload();
  }).catch(() => {});
  setInterval(look, 1000);
})();"""


class LLMTab:
    """The LLM tabs, their CSV, the live charts, the last report and ``/metrics`` on Locust's web UI, fed by the
    sources the process passes (read at each request: a run's numbers, its report, its error)."""

    def __init__(self, environment: Any, summary_source: Callable[[], dict | None], slos: list | None = None,
                 report_source: Callable[[], str | None] = lambda: None,
                 error_source: Callable[[], str | None] = lambda: None,
                 metrics_registry: Callable[[], Any] = lambda: None,
                 live_source: Callable[[], dict] = lambda: {},
                 target_source: Callable[[], Any] = lambda: None,
                 swarm_check: Callable[[str], str | None] = lambda host: None) -> None:
        self.environment, self.summary_source, self.slos = environment, summary_source, slos
        self.report_source, self.error_source, self.metrics_registry = report_source, error_source, metrics_registry
        self.live_source, self.target_source, self.swarm_check = live_source, target_source, swarm_check

    def install(self) -> None:
        web_ui = self.environment.web_ui
        if web_ui is None:
            return
        structure = [{"key": "metric", "title": "Metric"}, {"key": "count", "title": "Count"},
                     {"key": "mean", "title": "Mean"}] + [{"key": c, "title": c} for c in COLUMNS]
        by_name = [{"key": f"c{i}", "title": t} for i, t in enumerate(NAME_HEAD)]
        args = web_ui.template_args
        args["extended_tabs"] = [{"title": "LLM", "key": "llm"}, {"title": "LLM by name", "key": "llm_names"}]
        args["extended_tables"] = [{"key": "llm", "structure": structure}, {"key": "llm_names", "structure": by_name}]
        args["extended_csv_files"] = [{"href": "/vllm-load/llm_stats.csv", "title": "LLM metrics (exact)"}]
        app = web_ui.app
        app.before_request(self._check_swarm)
        app.after_request(self._target_in_header)
        app.after_request(self._add_llm_stats)
        for rule, view in (("/vllm-load/report", self._report), ("/vllm-load/live", self._live_page),
                           ("/vllm-load/live.json", self._live_data), ("/vllm-load/state", self._state),
                           ("/metrics", self._metrics),
                           ("/vllm-load/llm_stats.csv", self._llm_csv)):
            app.add_url_rule(rule, f"vllm_load{view.__name__}", view)

    def _check_swarm(self) -> Any:
        """A swarm against a target that fails its check is refused where the user pressed start, with the reason
        (Locust would answer "Swarming started" and the run would stop at once, the error on the LLM tab only)."""
        from flask import jsonify, request

        if request.method == "POST" and request.path.rstrip("/").endswith("/swarm"):
            why = self.swarm_check(request.form.get("host") or self.environment.host or "")
            if why:
                return jsonify({"success": False, "message": f"vllm-load: {why}", "host": self.environment.host})
        return None

    def _target_in_header(self, response: Any) -> Any:
        """Locust's header shows the host only; what it is (the built-in EMULATOR, vLLM and its version) goes
        beside it on every tab, so no one reads emulator numbers as a server's."""
        from flask import request

        if request.path != "/" or response.status_code != 200 or response.mimetype != "text/html":
            return response
        target = self.target_source()
        if target is None:
            return response
        text = escape(f"Target: {target.kind} · model {target.model}")
        emulator = " (results describe the emulator, not a real vLLM: --host points at a server)" \
            if target.is_emulator else ""
        # in the header's free middle, between Locust's logo (~210 px) and its host/status block (BADGE_FIT)
        style = ("position:fixed;top:20px;left:230px;max-width:calc(100vw - 760px);display:flex;"
                 "white-space:nowrap;z-index:2000;padding:3px 10px;"
                 "font:600 12px sans-serif;border-radius:6px;"
                 + ("background:#f5c542;color:#000" if target.is_emulator else "background:#2e7d32;color:#fff"))
        links = ("<span class='vllm-load-links' style='flex:none'>"
                 "&nbsp;· <a href='./vllm-load/live' target='_blank' style='color:inherit'>live charts</a>"
                 " · <a href='./vllm-load/report' target='_blank' style='color:inherit'>last report</a></span>")
        banner = (f"<div id='vllm-load-target' style='{style}' title='{text}{escape(emulator)}'>"
                  f"<span style='overflow:hidden;text-overflow:ellipsis;min-width:0'>{text}</span>{links}</div>"
                  f"<script>{BADGE_FIT}{CHARTS_TAB}{LINK_CELLS}{FINAL_TURN}</script>")
        body = response.get_data(as_text=True)
        if "</body>" in body:
            response.set_data(body.replace("</body>", banner + "</body>", 1))
        return response

    def _report(self) -> Any:
        from flask import Response

        path = self.report_source()
        if not path:
            return Response("no report yet: it is written when a run stops", status=404, mimetype="text/plain")
        with open(path, encoding="utf-8") as fh:
            return Response(fh.read(), mimetype="text/html")

    def _live_page(self) -> Any:
        from flask import Response

        from vllm_load.plugin.webui.live_charts import page

        return Response(page(), mimetype="text/html")

    def _state(self) -> Any:
        """The runner's state and whether the numbers are the run's judged ones (FINAL_TURN asks every second)."""
        from flask import jsonify

        runner = self.environment.runner
        summary = self.summary_source() if runner is not None and runner.state != "ready" else None
        return jsonify({"state": runner.state if runner is not None else "ready",
                        "final": bool(summary and summary.get("final"))})

    def _live_data(self) -> Any:
        from flask import Response

        return Response(json.dumps(self.live_source()), mimetype="application/json")

    def _metrics(self) -> Any:
        from flask import Response
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.metrics_registry()), mimetype=CONTENT_TYPE_LATEST)

    def _llm_csv(self) -> Any:
        from flask import Response

        from vllm_load.report.exports.csv_export import llm_stats_csv

        summary = self.summary_source()
        body = llm_stats_csv(summary) if summary else llm_stats_csv({"metrics": {}})
        return Response(body, mimetype="text/csv",
                        headers={"Content-Disposition": "attachment; filename=llm_stats.csv"})

    def _add_llm_stats(self, response: Any) -> Any:
        """The LLM tabs' rows, added to the answer of Locust's own stats poll."""
        from flask import request

        if request.path != "/stats/requests" or response.status_code != 200:
            return response
        raw = self.summary_source()
        summary = RunSummary.of(raw) if raw else None  # read once per poll: every row below takes it as it is
        rows = _summary_rows(summary, self.slos, bool(self.report_source())) if summary else []
        target = self.target_source()
        if target is not None:  # what the numbers describe: the built-in emulator, or the server and its model
            rows.insert(0, {"metric": "Target", "count": target.kind,
                            "mean": f"{target.host} model {target.model}" + (
                                " (the built-in emulator: results describe it, not a real vLLM; --host points at a "
                                "server)" if target.is_emulator else "")})
        error = self.error_source()
        if error:  # a target that failed its check, or a run stopped by a failure every request would repeat
            rows.insert(0, {"metric": "ERROR", "count": "", "mean": error})
        data = response.get_json(silent=True) or {}
        named = [{f"c{i}": c for i, c in enumerate(r)} for r in _group_rows(summary)] if summary else []
        if not named:  # an empty tab says how to fill it
            named = [{"c0": "no request was named yet: give self.llm.chat(..., name=\"turn 1\") a name= (the "
                            "multiturn.py and agent.py locustfiles name their turns and tool rounds)"}]
        data["extended_stats"] = [{"key": "llm", "data": rows}, {"key": "llm_names", "data": named}]
        response.set_data(json.dumps(data))
        return response


def _summary_rows(s: RunSummary, slos: list | None, has_report: bool) -> list[dict]:
    """The LLM tab's rows under the metric table: rates, trust, the server, SLO previews, routing, where the time
    went, the report's link, prompt drift. The poll's own keys (``final``, ``live_output_tps``, ``server``) are the
    summary's ``extra``."""
    rows = table_rows(s)
    if s.get("final"):
        rows.append({"metric": "Run stopped: its judged numbers (as in the report)", "count": "", "mean": ""})
    else:
        rows.append({"metric": "Output tok/s (live, last 10 s)", "count": "", "mean": f"{s['live_output_tps']:.1f}"})
    rows.append({"metric": "Live charts (TTFT, ITL, tok/s, server)", "count": "", "mean": "/vllm-load/live"})
    rows.append({"metric": "Output tok/s (run)", "count": s.output_tokens,
                 "mean": f"{s.output_token_rate:.1f}"})
    rows.append({"metric": "Requests ok / failed", "count": s.requests,
                 "mean": f"{s.succeeded} / {s.failed}"})
    client = s.client
    if client and client.saturated:
        rows.append({"metric": f"UNTRUSTWORTHY: {who_fell_behind(client.cause)} ({client.cause})",
                     "count": "", "mean": "; ".join(client.reasons) + ": " + client.advice})
    if s.get("server"):
        rows += [{"metric": f"Server: {t}", "count": "", "mean": v} for t, v in server_cells(s["server"])]
    elif "server" in s:
        rows.append({"metric": "Server side", "count": "", "mean": "missing (no sidecar data yet)"})
    if slos:
        from vllm_load.metrics.judge.slo import evaluate
        from vllm_load.metrics.judge.verdict import word

        # a live preview of the SLOs on the numbers so far; the run's verdict is judged once, at its end
        rows += [{"metric": f"SLO {c.slo}", "count": word(c.passed), "mean": c.detail}
                 for c in evaluate(slos, s, s.get("server"))]
    parts = s.features or {}  # what each feature says of the run (vllm_load/features/), once the run has judged it
    rows += [{"metric": f.name.replace("_", " ").capitalize(), "count": "", "mean": line}
             for f in FEATURES if f.name in parts for line in f.lines(parts[f.name], {})]
    rows += [{"metric": "Where the time went", "count": "", "mean": line} for line in tail_lines(s.timing)]
    if has_report:
        rows.append({"metric": "Report of the last run", "count": "", "mean": "/vllm-load/report"})
    if s.input_drift_requests:
        rows.append({"metric": "PROMPT LENGTH DRIFT (requests, max)", "count": s.input_drift_requests,
                     "mean": s.input_drift_max_abs})
    return rows


def _group_rows(summary: RunSummary) -> list[list[str]]:
    """The "LLM by name" tab's rows: each name's, then each target's (--host a,b), then the one total."""
    names, targets = name_rows(summary, "names"), name_rows(summary, "targets")
    if not names and not targets:
        return []
    return [*names[:-1], *([f"target {r[0]}", *r[1:]] for r in targets[:-1]), (names or targets)[-1]]


def live_summary(totals: Any, start_wall: float, health: Any = None,
                 user_errors: list[tuple[int, str, str]] | None = None) -> dict:
    """What the web UI polls: the summary so far (as JSON) with the last seconds' output rate, judged as the end
    judges it (the same send lag, and a task raising in a loop named, not a lack of workers). ``user_errors``:
    Locust's exception rows (count, message, traceback)."""
    summary = totals.summary(duration=max(time.time() - start_wall, 1e-9), outage_after=None)
    if health is not None:
        summary = summary.replace(client=health.judge(summary, user_errors or []))
    return {**summary.to_json(), "live_output_tps": totals.recent_output_tps(time.time())}
