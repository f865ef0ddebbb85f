"""The web UI's start form as the command line groups it: the options the run's locustfile reads, under the groups
of ``vllm-load options`` (what a first run needs first), each with a short label and its whole help on hover.

Locust lists every custom option flat, sorted by name, labelled with its title-cased name and the whole help in
brackets. Its form is Locust's own React page: the options it is sent are filtered here, and a small script orders
and labels the fields it draws (CSS ``order`` in the form's flex column, one heading per group)."""

from __future__ import annotations

import json
from typing import Any, Iterable

from vllm_load.options import GROUPS, OPTIONS, Option
from vllm_load.plugin.prepare import validate

#: what a first run changes, shown before the groups
FIRST_RUN = ("--input-tokens", "--output-tokens", "--request-rate", "--num-requests", "--warmup")
FIRST_TITLE = "first run"


def label(option: Option) -> str:
    """The short label: the flag's words ("--input-tokens" -> "input tokens")."""
    return option.flag.lstrip("-").replace("-", " ")


def fields(classes: Iterable[Any]) -> dict[str, dict]:
    """Each form field (an option's dest) the run reads: its group, its place, its label and its help."""
    classes = list(classes)
    by_flag = {o.flag: o for o in OPTIONS}
    out: dict[str, dict] = {}
    sections = [(FIRST_TITLE, FIRST_RUN), *((g, tuple(f for f in flags if f not in FIRST_RUN))
                                           for g, flags in GROUPS.items())]
    for rank, (group, flags) in enumerate(sections):
        shown = [by_flag[f] for f in flags if by_flag[f].web and by_flag[f].read_by(classes)]
        for i, o in enumerate(shown):
            out[o.dest] = {"group": group, "head": i == 0, "order": (rank + 1) * 100 + i + 1, "label": label(o),
                           "help": o.help}
    return out


def keep_used(extra_options: dict, classes: list[Any]) -> None:
    """Drop, in place, the form's options that no class of the run reads (the gate then refuses them too)."""
    unused = {o.dest for o in OPTIONS if not o.read_by(classes)}
    for dest in unused & set(extra_options):
        del extra_options[dest]


#: orders and labels the fields Locust's form draws, as they appear (the dialog mounts them when it opens)
SCRIPT = """(() => {
  const FIELDS = %s;
  const done = new WeakSet();
  // the field's box: the input's ancestor that is a child of the form's flex column (the one holding the fields)
  const boxOf = (input) => {
    for (let node = input; node.parentElement; node = node.parentElement) {
      const up = node.parentElement, css = getComputedStyle(up);
      if (css.display === 'flex' && css.flexDirection === 'column' && up.querySelectorAll('input[name]').length > 1) {
        return node;
      }
    }
    return null;
  };
  const destOf = (item) => {  // a named input's name (camelCase in Locust's form), else a select's label
    const named = item.querySelector('input[name], textarea[name]');
    if (named) return named.name.replace(/[A-Z]/g, c => '_' + c.toLowerCase());
    const text = item.querySelector('label');
    return text ? text.textContent.split(' (')[0].trim().toLowerCase().replace(/ /g, '_') : null;
  };
  const place = (item, dest, meta) => {
    done.add(item);
    item.style.order = meta.order;
    item.title = meta.help;
    item.dataset.vllmLoadField = dest;
    // a checkbox's text first: its <label> holds the box itself; an outlined field's notch is sized by its legend
    const text = item.querySelector('.MuiFormControlLabel-label') || item.querySelector('label');
    if (text) {
      const star = text.querySelector('.MuiFormLabel-asterisk');
      text.textContent = meta.label;
      if (star) text.appendChild(star);
    }
    for (const notch of item.querySelectorAll('legend > span')) notch.textContent = meta.label;
    if (meta.head) {
      const head = document.createElement('div');
      head.className = 'vllm-load-group';
      head.textContent = meta.group;
      head.style.cssText = 'order:' + (meta.order - 1) + ';font:600 13px sans-serif;text-transform:uppercase;' +
        'letter-spacing:.04em;opacity:.75;margin-top:6px';
      item.parentElement.appendChild(head);
    }
  };
  const apply = () => {
    const forms = new Set();
    for (const input of document.querySelectorAll('input[name], textarea[name]')) {
      const item = FIELDS[input.name.replace(/[A-Z]/g, c => '_' + c.toLowerCase())] && boxOf(input);
      if (item) forms.add(item.parentElement);
    }
    for (const form of forms) {
      for (const item of [...form.children]) {
        if (done.has(item) || item.classList.contains('vllm-load-group')) continue;
        const dest = destOf(item);
        if (dest && FIELDS[dest]) place(item, dest, FIELDS[dest]);
      }
    }
  };
  apply();
  new MutationObserver(apply).observe(document.body, {childList: true, subtree: true});
})();"""


def script(classes: Iterable[Any]) -> str:
    return SCRIPT % json.dumps(fields(classes))


def install(environment: Any) -> None:
    """The form's options cut to those the run reads (every time Locust builds its page's arguments), and the
    script on its page."""
    web_ui = environment.web_ui
    _shape, classes = validate.run_classes(environment)  # the classes whose options the command line accepts
    update = web_ui.update_template_args

    def update_template_args() -> None:
        update()
        keep_used(web_ui.template_args.get("extra_options") or {}, classes)

    web_ui.update_template_args = update_template_args
    update_template_args()  # the gate reads the form's options from these before any page was served
    tag = f"<script>{script(classes)}</script>"

    def add_script(response: Any) -> Any:
        from flask import request

        if request.path == "/" and response.status_code == 200 and response.mimetype == "text/html":
            body = response.get_data(as_text=True)
            if "</body>" in body:
                response.set_data(body.replace("</body>", tag + "</body>", 1))
        return response

    web_ui.app.after_request(add_script)
