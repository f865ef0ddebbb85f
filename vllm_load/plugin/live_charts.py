"""Live LLM charts for Locust's web UI (``/vllm-load/live``, linked from the LLM tab): TTFT and ITL p50/p99 per
10 s window and output tokens/s from the merged exact stats, and the server's KV-cache usage, running and
waiting from the sidecar, refreshed every 2 s like Locust's own charts. The page draws on canvases with no
library (the web UI may have no internet), and says how many points each chart drew."""

from __future__ import annotations

from typing import Any

#: seconds between two refreshes of the page's data
REFRESH_S = 2


def live_series(stats: Any, start: float, server_samples: list[dict] | None) -> dict:
    """The charts' data: times in seconds since the run started, latencies in ms."""
    out: dict[str, list] = {"t": [], "ttft_p50": [], "ttft_p99": [], "itl_p50": [], "itl_p99": []}
    if stats is not None:
        for w in sorted(stats.windows):
            ms = stats.windows[w]
            ttft, itl = ms.get("ttft"), ms.get("itl_token")
            if not ttft or not ttft.count:
                continue
            out["t"].append(round(w + 5 - start, 1))
            out["ttft_p50"].append(ttft.percentile(50) * 1000)
            out["ttft_p99"].append(ttft.percentile(99) * 1000)
            out["itl_p50"].append(itl.percentile(50) * 1000 if itl and itl.count else None)
            out["itl_p99"].append(itl.percentile(99) * 1000 if itl and itl.count else None)
        secs = sorted(stats.tokens_per_second)
        out["tps_t"] = [s - start for s in secs]
        out["tps"] = [stats.tokens_per_second[s] for s in secs]
    samples = server_samples or []
    out["server_t"] = [round(s["t"] - start, 1) for s in samples]
    out["kv"] = [100 * (s.get("kv_cache_usage") or 0) for s in samples]
    out["running"] = [s.get("running") for s in samples]
    out["waiting"] = [s.get("waiting") for s in samples]
    return out


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>vllm-load live</title><style>
body{font-family:sans-serif;margin:16px;background:#fff}.c{display:inline-block;margin:6px;vertical-align:top}
canvas{border:1px solid #ddd}h3{margin:4px 0;font-size:14px}.n{color:#666;font-size:12px}</style></head><body>
<h2>vllm-load: live LLM charts</h2><p class="n">Exact merged histograms, 10 s windows; server side from the sidecar.
Refreshed every %(refresh)d s. <a href="/">back to Locust</a></p><div id="charts"></div>
<script>
const CHARTS = [
  {id: "ttft", title: "TTFT (ms)", x: "t", ys: [["ttft_p50", "p50", "#1f77b4"], ["ttft_p99", "p99", "#d62728"]]},
  {id: "itl", title: "ITL per token (ms)", x: "t", ys: [["itl_p50", "p50", "#1f77b4"], ["itl_p99", "p99", "#d62728"]]},
  {id: "tps", title: "output tokens/s", x: "tps_t", ys: [["tps", "tok/s", "#2ca02c"]]},
  {id: "kv", title: "server: KV-cache usage (%%)", x: "server_t", ys: [["kv", "KV %%", "#9467bd"]]},
  {id: "queue", title: "server: running / waiting", x: "server_t",
   ys: [["running", "running", "#1f77b4"], ["waiting", "waiting", "#ff7f0e"]]},
];
const root = document.getElementById("charts");
for (const c of CHARTS) {
  const d = document.createElement("div"); d.className = "c";
  d.innerHTML = `<h3>${c.title}</h3><canvas id="cv-${c.id}" width="460" height="200"></canvas>` +
                `<div class="n">points: <span id="points-${c.id}">0</span></div>`;
  root.appendChild(d);
}
function draw(c, data) {
  const cv = document.getElementById("cv-" + c.id), g = cv.getContext("2d");
  g.clearRect(0, 0, cv.width, cv.height);
  const xs = data[c.x] || [];
  let ymax = 0, xmin = Infinity, xmax = -Infinity, n = 0;
  for (const [k] of c.ys) (data[k] || []).forEach((v, i) => { if (v != null) { ymax = Math.max(ymax, v);
      xmin = Math.min(xmin, xs[i]); xmax = Math.max(xmax, xs[i]); n++; } });
  document.getElementById("points-" + c.id).textContent = n;
  if (!n) { g.fillStyle = "#999"; g.fillText("no data yet", 10, 20); return; }
  if (xmax === xmin) xmax = xmin + 1; if (!ymax) ymax = 1;
  const L = 40, B = 20, W = cv.width - L - 8, H = cv.height - B - 8;
  g.strokeStyle = "#ccc"; g.beginPath(); g.moveTo(L, 8); g.lineTo(L, 8 + H); g.lineTo(L + W, 8 + H); g.stroke();
  g.fillStyle = "#333"; g.fillText(ymax.toFixed(ymax < 10 ? 2 : 0), 2, 14); g.fillText("0", 2, 8 + H);
  g.fillText(xmax.toFixed(0) + " s", L + W - 30, cv.height - 4);
  c.ys.forEach(([k, label, color], j) => {
    g.strokeStyle = color; g.fillStyle = color; g.lineWidth = 2; g.beginPath(); let started = false;
    (data[k] || []).forEach((v, i) => { if (v == null) return;
      const px = L + (xs[i] - xmin) / (xmax - xmin) * W, py = 8 + H - v / ymax * H;
      if (started) g.lineTo(px, py); else { g.moveTo(px, py); started = true; }
      g.fillRect(px - 1.5, py - 1.5, 3, 3); });
    g.stroke(); g.fillText(label, L + 8 + 60 * j, 20);
  });
  let painted = 0; const px = g.getImageData(0, 0, cv.width, cv.height).data;
  for (let i = 3; i < px.length; i += 4) if (px[i]) painted++;
  cv.setAttribute("data-painted", painted);
}
async function refresh() {
  try {
    const data = await (await fetch("/vllm-load/live.json")).json();
    for (const c of CHARTS) draw(c, data);
    document.body.setAttribute("data-refreshed", "1");
  } catch (e) { document.body.setAttribute("data-error", String(e)); }
}
refresh(); setInterval(refresh, %(refresh)d * 1000);
</script></body></html>
"""


def page() -> str:
    return PAGE % {"refresh": REFRESH_S}
