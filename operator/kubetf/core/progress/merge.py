"""A report folded into the job's ``status.progress``: its position, metrics, history, percent and summary (the rates
and the ETA: kubetf.core.progress.rates). Pure: the operator holds the result (kubetf.runtime.progress.book) and the
job's status write carries it (kubetf.core.reconcile)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kubetf.core.progress import rates
from kubetf.core.progress.protocol import MAX_METRICS, NON_FINITE, Report, finite, json_number
from kubetf.core.status import format_time

HISTORY_POINTS = 60
HISTORY_METRICS = 3  # besides loss: the first few metrics a run reports


@dataclass(frozen=True)
class Held:
    """A job's progress as the operator holds it (newer than the job's status until written): the whole value of
    ``status.progress`` (a key it lacks is not there any more), a version that moves with every report, and
    whether its write is due (the write budget released it, or a final report waits: `release`)."""

    progress: dict[str, Any]
    version: int
    release: bool


def merge(
    progress: dict[str, Any] | None,
    report: Report,
    role: str,
    index: int,
    coordinator: bool,
    now: float,
    run_began: float | None = None,
) -> dict[str, Any]:
    """The new ``status.progress`` after ``report`` from task ``role``-``index`` at ``now`` (Unix seconds).

    ``coordinator``: the task that reports training progress (the chief, else worker 0). The evaluator's reports
    become ``evalMetrics``; other tasks' reports change nothing. ``run_began``: when the job's current run began (its
    latest restart or admission, kubetf.core.goodput.run_began): the first report after it is the run's first step
    (``runStartTime``). The result is a new dict (JSON-able); the input is not modified.
    """
    old = sane(progress)
    if role == "evaluator":
        return _merge_evaluation(old, report, now)
    if not coordinator:
        return old
    return _merge_training(old, report, now, run_began)


_COUNTS = ("epoch", "epochs", "step", "steps", "evalEpoch", "evalStep", "etaSeconds")
_NUMBERS = ("percent", "stepsPerSecond", "examplesPerSecond", "secondsPerEpoch")
_TEXTS = ("summary", "eta", "lastReportTime", "lastProgressTime", "lastEvalTime", "runStartTime")


def sane(progress: Any) -> dict[str, Any]:
    """A copy of a stored ``status.progress`` with only well-typed fields: anyone who can edit the status could
    have put anything there, and a report must still be taken."""
    if not isinstance(progress, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in progress.items():
        if key in _COUNTS:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif key in _NUMBERS:
            ok = finite(value) is not None
        elif key in _TEXTS:
            ok = isinstance(value, str) and (not key.endswith("Time") or rates.time_of(value) is not None)
        elif key in ("metrics", "evalMetrics"):
            value = (
                {k: v for k, v in value.items() if isinstance(k, str) and _metric_value(v)}
                if isinstance(value, dict)
                else None
            )
            ok = value is not None
        elif key == "history":
            value = (
                [dict(p) for p in value if isinstance(p, dict) and finite(p.get("time")) is not None]
                if isinstance(value, list)
                else None
            )
            ok = value is not None
        elif key == "final":
            ok = value is True
        elif key == "resumedFrom":
            at = value.get("at") if isinstance(value, dict) else None
            ok = isinstance(at, str) and rates.time_of(at) is not None and finite(value.get("lostSeconds")) is not None
            value = {"at": value["at"], "lostSeconds": value["lostSeconds"]} if ok else None
        else:
            ok = False  # not a field of ours
        if ok:
            out[key] = json.loads(json.dumps(value))
    return out


def _metric_value(value: Any) -> bool:
    return finite(value) is not None or (isinstance(value, str) and value in NON_FINITE)


def _merge_evaluation(new: dict[str, Any], report: Report, now: float) -> dict[str, Any]:
    new["evalMetrics"] = {k: json_number(v) for k, v in report.metrics.items()}
    for key, value in (("evalEpoch", report.epoch), ("evalStep", report.step)):
        if value is None:
            new.pop(key, None)
        else:
            new[key] = value
    new["lastEvalTime"] = format_time(now)
    return new


def restarted(progress: dict[str, Any], report: Report) -> bool:
    """The run went back: its step (else its epoch) is below the last one, as after a resume from a checkpoint."""
    if report.step is not None and isinstance(progress.get("step"), int):
        return report.step < progress["step"]
    if report.epoch is not None and isinstance(progress.get("epoch"), int):
        return report.epoch < progress["epoch"]
    return False


def _merge_training(old: dict[str, Any], report: Report, now: float, run_began: float | None) -> dict[str, Any]:
    new = dict(old)
    back = restarted(old, report)
    after_final = bool(old.get("final"))  # a new run of the program: the time in between is no training
    reported = rates.time_of(old.get("lastReportTime"))
    # The times are whole seconds: a report in the second of the restart is the old run's (a new one takes longer)
    first = back or after_final or reported is None or (run_began is not None and reported <= run_began)
    for key, value in (("epochs", report.epochs), ("steps", report.steps)):
        if value is not None:
            new[key] = value
    for key, value in (("epoch", report.epoch), ("step", report.step)):
        if value is not None:
            new[key] = value
        elif back:  # what the old run had done past the checkpoint is gone; its position is unknown now
            new.pop(key, None)
    moved = (new.get("epoch"), new.get("step")) != (old.get("epoch"), old.get("step")) or "lastProgressTime" not in old
    if moved:
        new["lastProgressTime"] = format_time(now)
    if first:  # a run's first report (goodput: its first step)
        new["runStartTime"] = format_time(now)
    if back:  # what a restart threw away, for goodput's `redone`: the old run's lead at its own rate
        new["resumedFrom"] = {"at": format_time(now), "lostSeconds": round(_lost_seconds(old, report), 1)}
    new["lastReportTime"] = format_time(now)
    if report.final:
        new["final"] = True
    else:
        new.pop("final", None)

    if report.metrics:
        latest = {k: json_number(v) for k, v in report.metrics.items()}
        for name, value in (old.get("metrics") or {}).items():  # the latest value of each name
            if name not in latest and len(latest) < MAX_METRICS:
                latest[name] = value
        new["metrics"] = latest

    history = [dict(p) for p in old.get("history") or [] if isinstance(p, dict)]
    if back:
        history = [p for p in history if not _past(p, report)]
    last = history[-1] if history and not (back or after_final) else None
    rates.update(new, old, report, last, now, back or after_final)
    _add_point(history, report, now)
    new["history"] = history

    percent = _percent(new)
    if percent is None:
        new.pop("percent", None)
    else:
        new["percent"] = percent
    new["summary"] = _summary(new, percent)
    eta = rates.eta_seconds(new)
    if eta is None or (report.final and (percent or 0) < 100):
        new.pop("etaSeconds", None)
        new.pop("eta", None)
    else:
        new["etaSeconds"] = eta
        new["eta"] = rates.duration(eta)
    return new


def _past(point: dict[str, Any], report: Report) -> bool:
    """A history point beyond where the restarted run resumed."""
    if report.step is not None and isinstance(point.get("step"), int):
        return bool(point["step"] > report.step)
    if report.epoch is not None and isinstance(point.get("epoch"), int):
        return bool(point["epoch"] > report.epoch)
    return True  # no way to place it on the new run's axis


def _add_point(history: list[dict[str, Any]], report: Report, now: float) -> None:
    point: dict[str, Any] = {}
    if report.step is not None:
        point["step"] = report.step
    if report.epoch is not None:
        point["epoch"] = report.epoch
    point["time"] = round(now, 3)
    last = history[-1] if history else None
    names = [k for k in (last or {}) if k not in ("step", "epoch", "time", "loss")]
    for name in report.metrics:
        if name != "loss" and name not in names:
            names.append(name)
    for name in ["loss", *names[:HISTORY_METRICS]]:
        if name in report.metrics:
            point[name] = json_number(report.metrics[name])
    if last is not None and (last.get("step"), last.get("epoch")) == (point.get("step"), point.get("epoch")):
        history[-1] = {**last, **point}  # the same place again (a final report): one point
        return
    history.append(point)
    while len(history) > HISTORY_POINTS:
        # Drop the point whose neighbours are closest in time: the points stay spread over the whole run.
        times = [finite(p.get("time")) or 0.0 for p in history]
        gaps = [(times[i + 1] - times[i - 1], i) for i in range(1, len(history) - 1)]
        del history[min(gaps)[1]]


def _percent(progress: dict[str, Any]) -> float | None:
    step, steps = progress.get("step"), progress.get("steps")
    epoch, epochs = progress.get("epoch"), progress.get("epochs")
    if isinstance(step, int) and isinstance(steps, int) and steps > 0:
        value = 100.0 * step / steps
    elif isinstance(epoch, int) and isinstance(epochs, int) and epochs > 0:
        value = 100.0 * epoch / epochs
    else:
        return None
    return min(100.0, math.floor(value * 10) / 10)


def _summary(progress: dict[str, Any], percent: float | None) -> str:
    if percent is not None:
        return f"{math.floor(percent)}%"
    if isinstance(progress.get("epoch"), int):
        return f"epoch {progress['epoch']}"
    return f"step {progress.get('step')}"


def _lost_seconds(old: dict[str, Any], report: Report) -> float:
    """How long the old run took over what the new one goes back on: its steps (else epochs) past the point the new
    run resumed from, at the old run's rate; 0 when the rate is not known."""
    rate, per_epoch = finite(old.get("stepsPerSecond")), finite(old.get("secondsPerEpoch"))
    if report.step is not None and isinstance(old.get("step"), int) and rate:
        return max(0, old["step"] - report.step) / rate
    if report.epoch is not None and isinstance(old.get("epoch"), int) and per_epoch:
        return max(0, old["epoch"] - report.epoch) * per_epoch
    return 0.0
