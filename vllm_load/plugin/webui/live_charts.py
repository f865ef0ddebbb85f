"""Live LLM charts for Locust's web UI (``/vllm-load/live``, linked from the LLM tab): the report's timeline charts
(``report/charts.timeline_of``: TTFT and ITL p50/p99 per 10 s window, output tokens/s, and from the sidecar the
server's requests, KV-cache usage, token rates and prefix-cache hit rate) drawn by the report's own uPlot script,
inlined (the web UI may have no internet), and refreshed every 2 s like Locust's own charts."""

from __future__ import annotations

from typing import Any

from vllm_load.report.charts import timeline_of
from vllm_load.report.page import CSS, asset

#: seconds between two refreshes of the page's data
REFRESH_S = 2


def live_series(stats: Any, start: float, server_samples: list[dict] | None) -> dict:
    """The charts' data (``report/charts``' shape): times in seconds since the run started, latencies in ms."""
    return {"charts": timeline_of(stats, start, server_samples or []) if stats is not None else []}


_LOOP = """
(function () {
  var host = document.getElementById("timeline-charts"), plots = {};
  function inked(box) {  /* how much of the chart's canvas is drawn (a blank chart is a bug) */
    var c = box.querySelector("canvas"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data, n = 0;
    for (var i = 3; i < d.length; i += 4) if (d[i]) n++;
    return n;
  }
  async function refresh() {
    try {
      var data = await (await fetch("/vllm-load/live.json")).json();
      data.charts.forEach(function (spec) {
        var rows = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
        if (plots[spec.id] && plots[spec.id].series.length === rows.length) plots[spec.id].setData(rows);
        else {
          var old = document.getElementById("chart-" + spec.id);
          if (old) old.remove();
          plots[spec.id] = window.vllmLoadDraw(spec, host);
        }
        var box = document.getElementById("chart-" + spec.id);
        box.setAttribute("data-points", String(spec.x.length));
        box.setAttribute("data-painted", String(inked(box)));
      });
      document.getElementById("waiting").hidden = data.charts.length > 0;
      document.body.setAttribute("data-refreshed", "1");
    } catch (e) { document.body.setAttribute("data-error", String(e)); }
  }
  refresh(); setInterval(refresh, %(refresh)d * 1000);
})();
"""


def page() -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>vllm-load live</title>"
            f"<style>{CSS}</style><style>{asset('uPlot.min.css')}</style></head><body>"
            "<h2>vllm-load: live LLM charts</h2><p class='hint'>Exact merged histograms, 10 s windows; server side "
            f"from the sidecar. Refreshed every {REFRESH_S} s. Hover for values; drag to zoom, double-click to reset; "
            f"click a legend entry to hide its series. <a href='/'>back to Locust</a></p>"
            "<p id='waiting' class='hint'>No request has finished yet: the charts appear with the first.</p>"
            "<div id='timeline-charts'></div>"
            f"<script>{asset('uPlot.iife.min.js')}</script><script>{asset('charts.js')}</script>"
            f"<script>{_LOOP % {'refresh': REFRESH_S}}</script></body></html>")

