"""Which reader a process uses: the native receive thread (the ``_rxnative`` extension, when built and not turned
off with ``VLLM_LOAD_NATIVE=0``) or Python's; what ``vllm-load native`` says of it; and how late the Python reader
read (the native thread measures its own)."""

from __future__ import annotations

import os
import time
from collections import Counter
from enum import IntEnum

try:
    from vllm_load.client import _rxnative
except ImportError:  # not built (no compiler at install time, not Linux)
    _rxnative = None

ENV = "VLLM_LOAD_NATIVE"
#: a read later than this after its segment landed counts as late: the C thread's threshold (1 ms)
LATE_S = _rxnative.LATE_NS / 1e9 if _rxnative is not None else 0.001


class BodyState(IntEnum):
    """How a streamed body stands (``BodyOutcome.state``), with the values C gives them (``enum body_state``)."""

    RUNNING = getattr(_rxnative, "BODY_RUNNING", 0)  # not ended by itself: in an outcome, its error stopped it
    COMPLETE = getattr(_rxnative, "BODY_COMPLETE", 1)  # its length read, or its last chunk
    CLOSED = getattr(_rxnative, "BODY_CLOSED", 2)  # the connection closed before its end
    MALFORMED = getattr(_rxnative, "BODY_MALFORMED", 3)  # malformed chunking
    DECLINED = getattr(_rxnative, "DECLINED", 4)  # an expected head the thread left to the event loop (``expect``)


DECLINED = BodyState.DECLINED


def built() -> bool:
    """The C extension is importable."""
    return _rxnative is not None


def enabled() -> bool:
    """This process reads streams with the native thread (built, and not turned off)."""
    return built() and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def describe() -> str:
    """One paragraph for ``vllm-load native``: the reader in use, and how to get the other."""
    if enabled():
        reader = _rxnative.Reader()
        for _ in range(100):  # the thread sets its priority as it starts
            if reader.stats()["priority"] != "starting":
                break
            time.sleep(0.001)
        return (f"native reader: in use ({_rxnative.__file__}). A C thread reads every streaming socket as "
                f"each chunk lands, at {reader.stats()['priority']}; {ENV}=0 switches to the Python reader.")
    if built():
        return f"Python reader: in use because {ENV}={os.environ.get(ENV)!r}; unset it for the native reader."
    return ("Python reader: in use because the native reader was not built (it needs Linux, a C compiler and "
            "Python's headers at install time: apt install gcc python3-dev, then pip install -e . again). "
            "The Python reader is exact while the client's loop keeps up with every stream.")


def reader_name() -> str:
    """What run metadata and ``vllm-load native`` report: "native" or "python"."""
    return "native" if enabled() else "python"


class PythonReadLag:
    """The same measure for the Python reader: how long after landing (kernel stamp) ``RxSocket.recv``
    read each segment. A read later than a stream's token gap is where its chunks merged."""

    __slots__ = ("max", "reads", "late")

    def __init__(self) -> None:
        self.max, self.reads, self.late = 0.0, 0, 0

    def note(self, lag: float) -> None:
        self.reads += 1
        if lag > self.max:
            self.max = lag
        if lag > LATE_S:
            self.late += 1

    def take(self) -> tuple[float, int, int]:
        out = (self.max, self.reads, self.late)
        self.max, self.reads, self.late = 0.0, 0, 0
        return out


python_lag = PythonReadLag()


#: how this process's answers were read since the monitor last asked: "native" (the C thread, kernel stamps),
#: "python" (the Python reader, kernel stamps) or "clock" (timed as the loop read them: TLS, a user's own pool)
used: Counter = Counter()
_NAMES = {"native": "native", "stamped": "python", "clock": "clock"}


def note_read(reader: str) -> None:
    """One answer read by ``reader`` (``rxstamp``'s NATIVE, STAMPED or CLOCK)."""
    used[_NAMES.get(reader, reader)] += 1


def take_used() -> list[str]:
    """The readers that read answers since the last call."""
    out = sorted(used)
    used.clear()
    return out
