"""Ctrl-C (SIGINT) ends a run at a safe point, as SIGTERM does.

Python's own handler raises KeyboardInterrupt in whatever bytecode the process runs next: with gevent
that is often a hub callback (handing a batch of finished streams to their greenlets, a thread pool's
result) or a user's task between counting a request and logging it. Raised there, the news in hand is
lost: requests that finished never wake, and the drain waits for them until its timeout. Here the
signal is taken by the event loop, which throws KeyboardInterrupt into the main greenlet where it waits
(Locust's ``main_greenlet.join()``): Locust then stops as it does on Ctrl-C, and nothing was cut mid-way.
"""

from __future__ import annotations

import signal
import threading

import gevent

_installed: list = []


def install() -> None:
    """Take SIGINT in the event loop (in the main thread, where Python's default handler is still set: a
    process that ignores SIGINT, or handles it itself, keeps its own)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    _installed.append(gevent.signal_handler(signal.SIGINT, _interrupt))


def _interrupt() -> None:
    hub = gevent.get_hub()
    hub.loop.run_callback(hub.parent.throw, KeyboardInterrupt)  # from the hub: no traceback printed
