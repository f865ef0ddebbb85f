"""One option of vllm-load's registry (``options.OPTIONS``) and its group: the declaration every option group's
module uses, so a group may live in a module of its own."""

from __future__ import annotations

from typing import Any, Iterable


class Option:
    """One option: its flag, default and help, and argparse's extras (type, action, choices, is_secret, …)."""

    def __init__(self, flag: str, default: Any, help: str, *, locustfiles: tuple[str, ...] = (),  # noqa: A002
                 shown_default: str = "", web: bool = True, **kw: Any) -> None:
        self.flag, self.default, self.help, self.kw = flag, default, help, kw
        #: settable from the web UI's form: not an option that names a file or folder on this machine, or a
        #: destination that receives credentials from the environment (a page that drives the form could point
        #: them anywhere; plugin/webui/web_gate.py refuses a field the form does not show)
        self.web = web
        #: what the default is, said where the option's value is decided later (an empty default that means one)
        self.shown_default = shown_default
        #: the shipped locustfiles that read it; empty: every run reads it. A user or shape class that reads
        #: such an option names it in its ``uses_options``; given to a run whose classes do not, it is refused.
        self.locustfiles = locustfiles
        self.group = ""  # its group in `vllm-load options`, the docs and the web UI's form (``group`` sets it)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return "VLLM_LOAD_" + self.dest.upper()

    def read_by(self, classes: Iterable[Any]) -> bool:
        """Does a run of these user and shape classes read it (an option of no locustfile in particular: every run)?"""
        return not self.locustfiles or any(self.dest in getattr(c, "uses_options", frozenset()) for c in classes)


def group(name: str, *options: Option) -> tuple[Option, ...]:
    """Options of one group, declared together: an option is defined once, its group included."""
    for o in options:
        o.group = name
    return options
