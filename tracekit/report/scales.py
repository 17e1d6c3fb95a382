"""Axis scales for the SVG plots: data values to pixels, linear or log10, with ticks."""

from __future__ import annotations

import math
from dataclasses import dataclass

LOG_PAD = 1.25


@dataclass(frozen=True)
class Scale:
    """Maps [low, high] of the data onto [start, end] pixels, linearly or in log10."""

    low: float
    high: float
    start: float
    end: float
    log: bool = False

    def __call__(self, value: float) -> float:
        """The pixel position of a data value (clamped into the axis)."""
        lo, hi, v = self.low, self.high, value
        if self.log:
            lo, hi, v = math.log10(lo), math.log10(hi), math.log10(max(value, self.low))
        fraction = 0.5 if hi == lo else (v - lo) / (hi - lo)
        fraction = min(1.0, max(0.0, fraction))
        return self.start + fraction * (self.end - self.start)

    def ticks(self) -> list[tuple[float, str]]:
        """Tick values with their labels: powers of ten on log axes, 1-2-5 steps otherwise."""
        values = _log_ticks(self.low, self.high) if self.log else _linear_ticks(self.low, self.high)
        return [(v, f"{v:.6g}") for v in values]


def make_scale(values: list[float], start: float, end: float, log: bool) -> Scale:
    """A scale spanning the values (positive ones only on a log axis), padded a little."""
    usable = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not usable:
        return Scale(1.0, 10.0, start, end, log)
    lo, hi = min(usable), max(usable)
    if log:
        # Room below the smallest value, so its bar or point stays visible.
        return Scale(lo / LOG_PAD, hi * LOG_PAD, start, end, True)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    return Scale(lo, hi, start, end, False)


def _linear_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round values between low and high."""
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten within [low, high]; 1-2-5 within a decade when the axis is short."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    multiples = (1, 2, 5) if last - first <= 2 else (1,)
    ticks = [m * 10.0**e for e in range(first, last + 1) for m in multiples]
    inside = [t for t in ticks if low <= t <= high]
    return inside or [low, high]
