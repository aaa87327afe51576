"""How fast a job trains and when it will be done: steps and examples per second, seconds per epoch, the ETA, and
how a duration is written in a column. Pure functions over ``status.progress`` (kubetf.core.progress.merge)."""

from __future__ import annotations

import math
from typing import Any

from kubetf.core.progress.protocol import Report, finite
from kubetf.core.status import parse_time

RATE_TIME_CONSTANT = 60.0  # seconds: computed rates follow the last minute or so


def time_of(value: Any) -> float | None:
    """A stored timestamp (``lastProgressTime`` ...) as Unix seconds; None when it is not one."""
    try:
        return parse_time(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _ema(previous: Any, sample: float, dt: float) -> float:
    old = finite(previous)
    if old is None:
        return sample
    weight = 1.0 - math.exp(-max(dt, 0.0) / RATE_TIME_CONSTANT)
    return old + weight * (sample - old)


def update(
    new: dict[str, Any], old: dict[str, Any], report: Report, last: dict[str, Any] | None, now: float, new_run: bool
) -> None:
    """``stepsPerSecond``/``examplesPerSecond`` as reported, else computed from the reports' steps over time (an
    average over about the last minute); ``secondsPerEpoch`` when only epochs are reported. `last`: the history's
    last point of this run (None on a new run)."""
    computed = False
    if report.steps_per_second is not None:
        new["stepsPerSecond"] = round(report.steps_per_second, 3)
    elif report.step is not None and last is not None and isinstance(last.get("step"), int):
        dt = now - (finite(last.get("time")) or now)
        done = report.step - last["step"]
        if dt > 0 and done >= 0:
            new["stepsPerSecond"] = round(_ema(old.get("stepsPerSecond"), done / dt, dt), 3)
            computed = True
    if report.examples_per_second is not None:
        new["examplesPerSecond"] = round(report.examples_per_second, 3)
    elif computed:
        examples, steps = finite(old.get("examplesPerSecond")), finite(old.get("stepsPerSecond"))
        if examples is not None and steps:  # examples per step, from when both were reported
            new["examplesPerSecond"] = round(new["stepsPerSecond"] * examples / steps, 3)
    if report.step is None and new.get("step") is None and report.epoch is not None and not new_run:
        before, since = old.get("epoch"), time_of(old.get("lastProgressTime"))
        if isinstance(before, int) and report.epoch > before and since is not None and now > since:
            sample = (now - since) / (report.epoch - before)
            spe = finite(old.get("secondsPerEpoch"))
            new["secondsPerEpoch"] = round(sample if spe is None else (spe + sample) / 2, 3)


def eta_seconds(progress: dict[str, Any]) -> int | None:
    """Seconds until the last step (else epoch) at the current rate; 0 when there; None when unknown."""
    step, steps, rate = progress.get("step"), progress.get("steps"), finite(progress.get("stepsPerSecond"))
    if isinstance(step, int) and isinstance(steps, int):
        if step >= steps:
            return 0
        return round((steps - step) / rate) if rate else None
    epoch, epochs, spe = progress.get("epoch"), progress.get("epochs"), finite(progress.get("secondsPerEpoch"))
    if isinstance(epoch, int) and isinstance(epochs, int):
        if epoch >= epochs:
            return 0
        return round((epochs - epoch) * spe) if spe else None
    return None


def _half_up(value: float) -> int:
    return math.floor(value + 0.5)


def duration(seconds: float) -> str:
    """``45s``, ``6m``, ``1h20m``, ``2d3h``: short, for a column."""
    s = max(0, _half_up(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3570:
        return f"{_half_up(s / 60)}m"
    if s < 86400:
        h, m = divmod(_half_up(s / 60), 60)
        return f"{h}h{m}m" if m else f"{h}h"
    d, h = divmod(_half_up(s / 3600), 24)
    return f"{d}d{h}h" if h else f"{d}d"
