"""Click types for seconds that are finite and bounded (issue 29).

`click.FloatRange` takes `inf` and `nan` (every comparison with nan is false, so nan passes any range):
`bc serve --heartbeat-interval nan` started a server whose timers never fired. `Seconds(low, high)` reads
a finite float within its range, or is click's usage error (exit 2) naming the option and the range.
"""

from __future__ import annotations

import math

import click

DAY_S = 86_400.0


class Seconds(click.ParamType[float]):
    name = "seconds"

    def __init__(self, low: float, high: float, *, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        too_low = seconds <= self.low if self.low_open else seconds < self.low
        if not math.isfinite(seconds) or too_low or seconds > self.high:
            low = f"{self.low:g}<x" if self.low_open else f"{self.low:g}<=x"
            self.fail(f"{value} is not in the range {low}<={self.high:g} (seconds)", param, ctx)
        return seconds


__all__ = ["DAY_S", "Seconds"]
