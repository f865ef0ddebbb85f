"""Token-length distributions, given as short specs on the command line.

  128             fixed
  100-200         uniform integers in [100, 200] (also ``uniform:100-200``)
  normal:512,64   normal(mean, std) rounded and clipped to mean +- 4 std (and >= 1), the range the
                  start-up checks validate, so no sample can fall below a template's minimum
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from vllm_load.errors import UsageError


@dataclass(frozen=True)
class LengthSpec:
    kind: str
    a: float
    b: float = 0.0
    text: str = ""

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return min(self.high, max(self.low, int(round(rng.gauss(self.a, self.b)))))

    @property
    def low(self) -> int:
        """The smallest length it can produce (for up-front validation)."""
        if self.kind == "normal":
            return max(1, int(self.a - 4 * self.b))
        return int(self.a)

    @property
    def high(self) -> int:
        """The largest length it produces in practice (normal: mean + 4 std)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return int(round(self.a + 4 * self.b))


def parse_length(spec: str | int, option: str) -> LengthSpec:
    text = str(spec).strip()
    try:
        if text.startswith("normal:"):
            mean, std = (float(x) for x in text[7:].split(","))
            if mean < 1 or std < 0:
                raise ValueError
            return LengthSpec("normal", mean, std, text)
        body = text[8:] if text.startswith("uniform:") else text
        if "-" in body:
            lo, hi = (int(x) for x in body.split("-"))
            if not 1 <= lo <= hi:
                raise ValueError
            return LengthSpec("uniform", lo, hi, text)
        value = int(body)
        if value < 1:
            raise ValueError
        return LengthSpec("fixed", value, text=text)
    except ValueError:
        raise UsageError(
            f"{option} {text!r} is not a length: use N, LOW-HIGH or normal:MEAN,STD with positive integers"
        ) from None


@dataclass(frozen=True)
class Seconds:
    """A pause drawn uniformly from [low, high] seconds (``--think-time 2`` or ``1-3``)."""

    low: float
    high: float

    def sample(self, rng: random.Random) -> float:
        return self.low if self.high <= self.low else rng.uniform(self.low, self.high)


def parse_seconds(text: str, option: str) -> Seconds:
    parts = str(text).strip().split("-")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v < 0 for v in values) or values[0] > values[-1]:
        raise UsageError(f"{option} {text!r} is not seconds: write S or LOW-HIGH, e.g. {option} 1-3")
    return Seconds(values[0], values[-1])


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str | float, option: str) -> float:
    """'15m', '30s', '1h', '500ms' or plain seconds; a bad value is a one-line UsageError."""
    m = _DURATION.match(str(text))
    if not m:
        raise UsageError(f"{option} {text!r} is not a duration: write e.g. 30s, 15m, 1h or a number of seconds")
    return float(m.group(1)) * _UNIT[m.group(2)]
