/* vllm-load's report charts: the specs in <script id="chart-data"> drawn with uPlot (vendored beside this file,
 * inlined into the page, so the report opens offline). Hover: every series' value at the cursor in the legend;
 * drag: zoom (the timeline charts zoom together); double-click: reset; click a legend entry: hide its series. */
(function () {
  "use strict";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
  var source = document.getElementById("chart-data");
  var data = source ? JSON.parse(source.textContent) : {};
  var marks = data.markers || {spans: [], saturation: null};
  var sync = uPlot.sync("timeline");
  var NINES = {"0": "p0", "0.301": "p50", "1": "p90", "2": "p99", "3": "p99.9"};
  /* every timeline chart spans the run's whole time, whatever its own series hold (a chart whose first point came
     later, or whose last came earlier, drew its own axis: the report's time axes did not line up) */
  var span = [Infinity, -Infinity];
  Object.keys(data).forEach(function (group) {
    (Array.isArray(data[group]) ? data[group] : []).forEach(function (spec) {
      if (spec.kind === "time" && spec.x.length) {
        span = [Math.min(span[0], spec.x[0]), Math.max(span[1], spec.x[spec.x.length - 1])];
      }
    });
  });
  function timeRange(u, lo, hi) {  /* the live page's data grows: the run's span so far, or more */
    return span[0] <= span[1] ? [Math.min(span[0], lo), Math.max(span[1], hi)] : [lo, hi];
  }

  function fmt(v) {
    if (v == null) return "-";
    if (v === 0) return "0";
    var a = Math.abs(v);
    return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toFixed(3);
  }

  function pctOf(nines) { return (100 * (1 - Math.pow(10, -nines))).toPrecision(4).replace(/\.?0+$/, ""); }

  /* outages (red), failure storms (orange), the over-saturated span (purple, dashed at its onset) and the fault
     plan's actions (a black line at each start, grey while it ran) */
  function drawMarks(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    function x(v) { return u.valToPos(v, "x", true); }
    ctx.save();
    marks.spans.forEach(function (s) {
      ctx.fillStyle = s.kind === "outage" ? "rgba(214,39,40,0.15)" : "rgba(255,127,14,0.15)";
      ctx.fillRect(x(s.from), top, x(s.to) - x(s.from), h);
    });
    (marks.faults || []).forEach(function (f) {
      ctx.fillStyle = "rgba(0,0,0,0.08)";
      ctx.fillRect(x(f.from), top, Math.max(1, x(f.to) - x(f.from)), h);
      ctx.fillStyle = "#000";
      ctx.fillRect(x(f.from), top, 1, h);
    });
    if (marks.saturation) {
      var a = x(marks.saturation.from), b = x(marks.saturation.to);
      ctx.fillStyle = "rgba(148,103,189,0.10)";
      ctx.fillRect(a, top, b - a, h);
      ctx.strokeStyle = "#9467bd";
      ctx.setLineDash([6, 4]);
      ctx.beginPath();
      ctx.moveTo(a, top);
      ctx.lineTo(a, top + h);
      ctx.stroke();
    }
    ctx.restore();
  }

  function draw(spec, host) {
    var box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + spec.id;
    var title = document.createElement("h3");
    title.textContent = spec.title;
    box.appendChild(title);
    host.appendChild(box);
    var nines = spec.kind === "nines", timeline = spec.kind === "time";
    var series = [{label: nines ? "percentile" : timeline ? "t (s)" : spec.x_label, value: function (u, v) {
      return v == null ? "-" : nines ? "p" + pctOf(v) : timeline ? v.toFixed(1) + " s" : fmt(v); }}];
    spec.series.forEach(function (s, i) {
      var right = s.axis === "y2", axisLabel = right ? spec.y2_label : spec.y_label;
      var unit = s.label.indexOf(axisLabel) >= 0 ? "" : " (" + axisLabel + ")";
      series.push({label: s.label + unit, stroke: COLORS[i % COLORS.length], width: 1.5, scale: right ? "y2" : "y",
                   dash: s.dash ? [6, 3] : undefined, spanGaps: true, points: {show: spec.kind === "level"},
                   paths: s.step ? uPlot.paths.stepped({align: -1}) : undefined,
                   value: function (u, v) { return fmt(v); }});
    });
    var xAxis = {label: spec.x_label, labelSize: 20};
    if (spec.x_integers) xAxis.incrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];  /* runs: no 1.25 */
    if (nines) {
      xAxis.splits = function () { return [0, 0.301, 1, 2, 3]; };
      xAxis.values = function (u, splits) { return splits.map(function (v) { return NINES[String(v)] || ""; }); };
    }
    var around = {range: function (u, lo, hi) {  /* a flat series gets a range around it, not ±5 % of nothing */
      if (lo == null) return [0, 1];
      if (hi - lo < 1e-9) return [Math.max(0, lo - Math.max(1, Math.abs(lo) * 0.1)), hi + Math.max(1, Math.abs(hi) * 0.1)];
      return [Math.min(0, lo), hi * 1.05]; }};
    var scales = {x: timeline ? {time: false, range: timeRange} : {time: false}, y: spec.y_range ? {range: spec.y_range} : around};
    var axes = [xAxis, {label: spec.y_label, labelSize: 20, size: 60, values: function (u, splits) { return splits.map(fmt); }}];
    if (spec.y2_label) {  /* a second unit on an axis of its own, on the right: req/s (2-5) drawn on the tok/s axis
                             (0-250) lay flat at 0 */
      scales.y2 = around;
      axes.push({scale: "y2", side: 1, label: spec.y2_label, labelSize: 20, size: 60, grid: {show: false},
                 values: function (u, splits) { return splits.map(fmt); }});
    }
    var opts = {
      width: Math.min(1100, Math.max(480, host.clientWidth - 20)), height: spec.height || 240,
      scales: scales,
      axes: axes,
      series: series,
      cursor: timeline ? {sync: {key: sync.key}} : {},
      hooks: timeline ? {draw: [drawMarks]} : {},
    };
    var plot = new uPlot(opts, [spec.x].concat(spec.series.map(function (s) { return s.values; })), box);
    box.setAttribute("data-points", String(spec.x.length));
    box.setAttribute("data-series", String(spec.series.length));
    return plot;
  }

  window.vllmLoadDraw = draw;  /* the web UI's live page draws the same charts, and refreshes their data */
  var plots = window.vllmLoadCharts = [];  /* the drawn charts, for a look from the browser's console (and tests) */
  Object.keys(data).forEach(function (group) {  /* each group of charts into its own <div id="GROUP-charts"> */
    var host = document.getElementById(group + "-charts");
    if (!host) return;
    if (!Array.isArray(data[group])) return;
    data[group].forEach(function (spec) { plots.push(draw(spec, host)); });
    host.setAttribute("data-drawn", String(host.querySelectorAll(".uplot").length));
  });
})();
