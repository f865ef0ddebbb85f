"""Pages from Jinja2 templates (``report/templates/``), with the static assets they inline (``report/static/``:
the vendored uPlot 1.6.32, MIT, and the charts' script), so each page is one file that opens offline."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import jinja2

#: the page's own style: the verdict block's colours say pass, fail, invalid and untrustworthy apart from the
#: emulator's notice (it was one yellow for all)
CSS = """
body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:1em;margin:1em 0 .3em}
table.t{border-collapse:collapse;margin:8px 0}.t td,.t th{border:1px solid #ccc;padding:3px 8px;text-align:right}
.t td:first-child,.t th:first-child{text-align:left}.t th{background:#f4f4f4}
.pass{color:#080;font-weight:bold}.fail{color:#c00;font-weight:bold}
.verdict{border-left:8px solid #999;padding:4px 16px;margin:12px 0;background:#fafafa}
.verdict.v-pass{border-color:#2a2;background:#f2fbf2}.verdict.v-fail{border-color:#c22;background:#fdf2f2}
.verdict.v-invalid{border-color:#c22;background:#fde8e8}.verdict.v-untrustworthy{border-color:#b06000;background:#fff5e6}
.banner{border:1px solid #d9a400;background:#fff8dc;padding:8px;margin:8px 0}
.banner.emulator{border-color:#5b7fb8;background:#eef3fb}.banner.invalid{border-color:#c22;background:#fde8e8}
.banner.untrusted{border-color:#b06000;background:#fdebd3}
.chart{margin:10px 0 18px}.hint,.note{color:#555;font-size:.9em}img{max-width:100%}
"""


@lru_cache(maxsize=None)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("vllm_load.report", "templates"),
                              autoescape=True, trim_blocks=False, undefined=jinja2.StrictUndefined)


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    """A static file's text (read once per process)."""
    return resources.files("vllm_load.report").joinpath("static", name).read_text(encoding="utf-8")


def render(template: str, **context: Any) -> str:
    """A page: the template with the style and the chart scripts inlined."""
    return _env().get_template(template).render(css=CSS, uplot_css=asset("uPlot.min.css"),
                                                uplot_js=asset("uPlot.iife.min.js"), charts_js=asset("charts.js"),
                                                **context)
