"""One policy for stopping signals, SIGINT and SIGTERM counted together in any order: the first stops the run, the
second cuts the requests in flight (``hurry``), the third quits at once with 128 + its number (130, 143), which no
documented exit code means (1 is "requests failed"). The process-level behaviour is tests/test_process_faults.py's."""

from __future__ import annotations

import signal

import pytest

from vllm_load.plugin.lifecycle import interrupt


@pytest.fixture
def policy(monkeypatch):
    cut, exits = [], []
    monkeypatch.setattr(interrupt, "ending", type("Ending", (), {"signals": 0})())
    monkeypatch.setattr(interrupt, "hurry", lambda: cut.append(True))

    def leave(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(interrupt.os, "_exit", leave)
    return cut, exits


@pytest.mark.parametrize("order", [(signal.SIGINT, signal.SIGINT, signal.SIGINT),
                                   (signal.SIGTERM, signal.SIGINT, signal.SIGTERM),
                                   (signal.SIGINT, signal.SIGTERM, signal.SIGINT)])
def test_the_second_signal_cuts_and_the_third_quits_whatever_their_kinds(policy, order, capsys):
    cut, exits = policy
    first, second, third = order
    assert interrupt.repeated(interrupt.noted(), first) is False and not cut  # the caller stops the run
    assert interrupt.repeated(interrupt.noted(), second) is True and cut == [True]
    with pytest.raises(SystemExit):
        interrupt.repeated(interrupt.noted(), third)
    assert exits == [128 + third] and exits[0] in (130, 143)
    err = capsys.readouterr().err
    assert f"a second signal ({second.name})" in err and f"a third signal ({third.name}): quitting now" in err


def test_each_controllers_count_is_its_own(policy):
    """The runs of vllm_load.testing, many in one process, each count their own signals: a global count made a
    suite's third in-process run quit its test process."""
    first, second = type("E", (), {"signals": 0})(), type("E", (), {"signals": 0})()
    assert [interrupt.noted(first), interrupt.noted(first), interrupt.noted(second)] == [1, 2, 1]
