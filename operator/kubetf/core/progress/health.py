"""The training's health, as the job's TrainingUnhealthy condition: a running job whose loss is NaN or infinite, or
whose step has not moved for the stall time. Judged on the freshest progress the operator holds (not the one its
status last stored: that write waits for its turn in a budget), so a busy operator never sees a stall that is not
there."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kubetf.core.progress.merge import sane
from kubetf.core.progress.protocol import NON_FINITE
from kubetf.core.progress.rates import duration, time_of
from kubetf.core.status import format_time

UNHEALTHY = "TrainingUnhealthy"  # a condition beside the phases: True with a reason while health() finds one


def _is_non_finite(value: Any) -> bool:
    if isinstance(value, str):
        return value in NON_FINITE
    return isinstance(value, float) and not math.isfinite(value)


def _position(progress: dict[str, Any]) -> str:
    parts = []
    if isinstance(progress.get("step"), int):
        parts.append(f"step {progress['step']}")
    if isinstance(progress.get("epoch"), int):
        total = progress.get("epochs")
        parts.append(f"epoch {progress['epoch']}" + (f"/{total}" if isinstance(total, int) else ""))
    return ", ".join(parts) or "the start"


def health(
    progress: dict[str, Any] | None, now: float, stall_seconds: float, done: bool = False
) -> list[tuple[str, str]]:
    """``(reason, message)`` for what is wrong with a running job's training: ``LossNotFinite`` (the latest loss,
    or any metric named ``*loss``, training or evaluation, is NaN or infinite), ``TrainingStalled`` (step and epoch
    have not moved for ``stall_seconds``; not once the task that reports them is `done`: it exited 0, and the rest
    of the job runs on without it). Empty when all is well or nothing was reported yet."""
    progress = sane(progress)
    if not progress:
        return []
    out: list[tuple[str, str]] = []
    bad = []
    for label, metrics in (("", progress.get("metrics")), ("evaluation ", progress.get("evalMetrics"))):
        for name, value in (metrics or {}).items() if isinstance(metrics, dict) else ():
            if name.lower().endswith("loss") and _is_non_finite(value):
                bad.append(f"{label}{name} is {value}")
    if bad:
        out.append(("LossNotFinite", f"{', '.join(bad)} at {_position(progress)}: the training diverged"))
    since = time_of(progress.get("lastProgressTime"))
    if since is not None and not done and now - since > stall_seconds:
        last = time_of(progress.get("lastReportTime"))
        if last is not None and now - last < stall_seconds:
            why = f"the program still reports (last {duration(now - last)} ago) but does not advance"
        else:
            why = f"no report for {duration(now - (last or since))}"
        out.append(
            ("TrainingStalled", f"no progress for {duration(now - since)}, still at {_position(progress)}: {why}")
        )
    return out


@dataclass(frozen=True)
class Judgement:
    """What the judge decided for the planned status: its conditions, Warning events (reason, message) for what
    newly went wrong, and when to look again (a stall falls due), if ever."""

    conditions: list[dict[str, Any]]
    events: list[tuple[str, str]] = field(default_factory=list)
    wake_at: float | None = None


def judge(
    status: dict[str, Any], progress: dict[str, Any] | None, now: float, stall_seconds: float, done: bool
) -> Judgement:
    """The TrainingUnhealthy condition of the planned `status`, from `progress` (the freshest the operator holds).
    Only a running job is judged: a queued, restarting or finished job is not training, and its condition is
    cleared. `done`: the task that reports progress exited 0."""
    running = status.get("phase") == "Running"
    found = health(progress, now, stall_seconds, done) if running else []
    conditions = [dict(c) for c in status.get("conditions") or []]
    current = next((c for c in conditions if c.get("type") == UNHEALTHY), None)
    events: list[tuple[str, str]] = []
    if found:
        reason, message = found[0][0], "; ".join(m for _, m in found)
        if current is None or current.get("status") != "True" or current.get("reason") != reason:
            events = [(r, m) for r, m in found if current is None or current.get("reason") != r]
        if current is None:
            current = {"type": UNHEALTHY}
            conditions.append(current)
        if current.get("status") != "True":
            current["lastTransitionTime"] = format_time(now)
        current.update(status="True", reason=reason, message=message)
    elif current is not None and current.get("status") == "True":
        current.update(
            status="False", reason="Healthy", message="training advances", lastTransitionTime=format_time(now)
        )
    since = time_of((progress or {}).get("lastProgressTime")) if running and not done else None
    wake = since + stall_seconds + 1 if since is not None and since + stall_seconds >= now else None
    return Judgement(conditions, events, wake)
