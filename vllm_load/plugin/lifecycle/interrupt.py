"""Ctrl-C (SIGINT) ends a run at a safe point, as SIGTERM does.

Python's own handler raises KeyboardInterrupt in whatever bytecode the process runs next: with gevent
that is often a hub callback (handing a batch of finished streams to their greenlets, a thread pool's
result) or a user's task between counting a request and logging it. Raised there, the news in hand is
lost: requests that finished never wake, and the drain waits for them until its timeout. Here the
signal is taken by the event loop, which throws KeyboardInterrupt into the main greenlet where it waits
(Locust's ``main_greenlet.join()``): Locust then stops as it does on Ctrl-C, and nothing was cut mid-way.

A second Ctrl-C, while the run's end waits for requests in flight, ends that wait (``hurry``): thrown into the main
greenlet again, it raised out of the drain with a traceback and lost summary.json. A third quits at once. SIGINT and
SIGTERM are counted together, on the process's controller (its ``Ending``: a count per controller, so the runs of
``vllm_load.testing``, many in one process, never add up; SIGTERM's in ``end_of_run.quitting``, where Locust's own
handler delivers it): the second signal of either kind cuts, the third quits with 128 + its number, in any order.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable

import gevent

_installed: list = []
#: what a second Ctrl-C does, and where the signals are counted: the process's controller sets both (its end stops
#: waiting for requests in flight; its ``Ending`` holds ``signals``)
hurry: Callable[[], None] | None = None
ending: Any = None


def install() -> None:
    """Take SIGINT in the event loop (in the main thread, where Python's default handler is still set: a
    process that ignores SIGINT, or handles it itself, keeps its own)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    _installed.append(gevent.signal_handler(signal.SIGINT, _interrupt))


class _Count:
    signals = 0  # a process's signals before it has a controller
    first_signal: tuple[str, float] | None = None


def noted(counter: Any = None, sig: signal.Signals = signal.SIGINT) -> int:
    """One more stopping signal (SIGINT or SIGTERM) on ``counter`` (default: the controller's ``Ending``): how many
    it has taken. The first is kept with its time (``first_signal``): a run it ended early says it was interrupted
    (``features/interrupted.py``)."""
    counter = counter if counter is not None else ending if ending is not None else _Count
    counter.signals += 1
    if counter.signals == 1:
        counter.first_signal = (sig.name, time.time())
    return counter.signals


def repeated(n: int, sig: signal.Signals) -> bool:
    """What the ``n``-th stopping signal does past the first: the second cuts the requests in flight (``hurry``), the
    third quits with 128 + its number (as a shell says of a process a signal ended; 1 means "requests failed").
    False for the first: the caller stops the run."""
    if n >= 3:
        sys.stderr.write(f"vllm-load: a third signal ({sig.name}): quitting now; the run's files may be incomplete\n")
        sys.stderr.flush()
        os._exit(128 + sig)
    if n == 2:
        if hurry is not None:
            sys.stderr.write(f"vllm-load: a second signal ({sig.name}): the requests still in flight are cut "
                             "(cancelled, in the log) and the run's end is written now (a third quits at once)\n")
            sys.stderr.flush()
            hurry()
        return True
    return False


def _interrupt() -> None:
    if repeated(noted(), signal.SIGINT):
        return
    hub = gevent.get_hub()
    hub.loop.run_callback(hub.parent.throw, KeyboardInterrupt)  # from the hub: no traceback printed
