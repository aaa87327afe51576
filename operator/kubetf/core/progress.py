"""Training progress in the TrainingJob's status: what the training pods report (protocol v1), and what the operator
makes of it. Pure functions: the HTTP endpoint parses a body with `parse_report`, folds it into `status.progress`
with `merge`, asks `health` for conditions while the job runs; the command line draws `curve`.

A report (``POST /v1/progress``, JSON, at most 16 KiB)::

    {"epoch": 3, "epochs": 10, "step": 1200, "steps": 4000, "metrics": {"loss": 0.31, "accuracy": 0.91},
     "stepsPerSecond": 12.5, "examplesPerSecond": 800.0, "final": false}

Every field is optional but one of ``epoch`` (finished epochs) and ``step`` (global steps done). Metric values are
numbers or the strings "NaN", "Infinity", "-Infinity" (JSON has no NaN). `status.progress` keeps non-finite values as
those strings, since the API server stores JSON too.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubetf.core.plan import Event, Plan
from kubetf.core.status import format_time, parse_time

MAX_BODY = 16 * 1024
MAX_METRICS = 32
METRIC_NAME = re.compile(r"[A-Za-z0-9_./-]{1,64}")
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
HISTORY_POINTS = 60
HISTORY_METRICS = 3  # besides loss: the first few metrics a run reports
RATE_TIME_CONSTANT = 60.0  # seconds: computed rates follow the last minute or so
MAX_INT = 2**53  # what a JSON number holds exactly

_FIELDS = {"epoch", "epochs", "step", "steps", "metrics", "stepsPerSecond", "examplesPerSecond", "final"}
_METRIC_TYPE = 'must be a number or "NaN"/"Infinity"/"-Infinity"'


class ReportError(ValueError):
    """A report the endpoint refuses: ``status`` is the HTTP status (400, 413), ``reason`` what is wrong."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Report:
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    steps: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # NaN and infinities as floats
    steps_per_second: float | None = None
    examples_per_second: float | None = None
    final: bool = False


def _reject_constant(name: str) -> Any:
    raise ReportError(400, f'body is not JSON: {name} is not a JSON value (send the string "{name}")')


def parse_report(body: bytes) -> Report:
    """A report from a request body; `ReportError` (400, or 413 over 16 KiB) says what is wrong, with the field."""
    if len(body) > MAX_BODY:
        raise ReportError(413, f"body is {len(body)} bytes, at most {MAX_BODY}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError(400, "body is not UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ReportError:
        raise
    except ValueError as exc:
        raise ReportError(400, f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ReportError(400, "body must be a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ReportError(400, f"{unknown[0]}: unknown field (v1 has {', '.join(sorted(_FIELDS))})")
    epoch = _count(data, "epoch", 0)
    epochs = _count(data, "epochs", 1)
    step = _count(data, "step", 0)
    steps = _count(data, "steps", 1)
    if epoch is None and step is None:
        raise ReportError(400, "epoch, step: at least one of them is required")
    metrics = _metrics(data.get("metrics"))
    final = data.get("final", False)
    if not isinstance(final, bool):
        raise ReportError(400, "final: must be true or false")
    return Report(
        epoch=epoch,
        epochs=epochs,
        step=step,
        steps=steps,
        metrics=metrics,
        steps_per_second=_rate(data, "stepsPerSecond"),
        examples_per_second=_rate(data, "examplesPerSecond"),
        final=final,
    )


def _count(data: dict[str, Any], name: str, least: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise ReportError(400, f"{name}: must be a whole number")
    if not least <= value <= MAX_INT:
        raise ReportError(400, f"{name}: must be between {least} and {MAX_INT}")
    return int(value)


def _rate(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ReportError(400, f"{name}: must be a non-negative number")
    return float(value)


def _metrics(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReportError(400, "metrics: must be an object of name: number")
    if len(value) > MAX_METRICS:
        raise ReportError(400, f"metrics: at most {MAX_METRICS} entries, got {len(value)}")
    out: dict[str, float] = {}
    for name, number in value.items():
        if not METRIC_NAME.fullmatch(name):
            raise ReportError(400, f"metrics.{name[:80]}: a name must match [A-Za-z0-9_./-]{{1,64}}")
        if isinstance(number, str) and number in NON_FINITE:
            out[name] = NON_FINITE[number]
        elif isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number):
            out[name] = float(number)
        else:
            raise ReportError(400, f"metrics.{name}: {_METRIC_TYPE}")
    return out


def _json_number(value: float) -> float | str:
    """Six significant digits; NaN and infinities as the protocol's strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(f"{value:.6g}")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def merge(
    progress: dict[str, Any] | None, report: Report, role: str, index: int, coordinator: bool, now: float
) -> dict[str, Any]:
    """The new ``status.progress`` after ``report`` from task ``role``-``index`` at ``now`` (Unix seconds).

    ``coordinator``: the task that reports training progress (the chief, else worker 0). The evaluator's reports
    become ``evalMetrics``; other tasks' reports change nothing. The result is a new dict (JSON-able); the input is
    not modified.
    """
    old = _sane(progress)
    if role == "evaluator":
        return _merge_evaluation(old, report, now)
    if not coordinator:
        return old
    return _merge_training(old, report, now)


_COUNTS = ("epoch", "epochs", "step", "steps", "evalEpoch", "evalStep", "etaSeconds")
_NUMBERS = ("percent", "stepsPerSecond", "examplesPerSecond", "secondsPerEpoch")
_TEXTS = ("summary", "eta", "lastReportTime", "lastProgressTime", "lastEvalTime")


def _sane(progress: Any) -> dict[str, Any]:
    """A copy of a stored ``status.progress`` with only well-typed fields: anyone who can edit the status could
    have put anything there, and a report must still be taken."""
    if not isinstance(progress, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in progress.items():
        if key in _COUNTS:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif key in _NUMBERS:
            ok = _finite(value) is not None
        elif key in _TEXTS:
            ok = isinstance(value, str) and (not key.endswith("Time") or _time(value) is not None)
        elif key in ("metrics", "evalMetrics"):
            value = (
                {k: v for k, v in value.items() if isinstance(k, str) and _metric_value(v)}
                if isinstance(value, dict)
                else None
            )
            ok = value is not None
        elif key == "history":
            value = (
                [dict(p) for p in value if isinstance(p, dict) and _finite(p.get("time")) is not None]
                if isinstance(value, list)
                else None
            )
            ok = value is not None
        elif key == "final":
            ok = value is True
        else:
            ok = False  # not a field of ours
        if ok:
            out[key] = json.loads(json.dumps(value))
    return out


def _metric_value(value: Any) -> bool:
    return _finite(value) is not None or (isinstance(value, str) and value in NON_FINITE)


def _time(value: Any) -> float | None:
    try:
        return parse_time(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _merge_evaluation(new: dict[str, Any], report: Report, now: float) -> dict[str, Any]:
    new["evalMetrics"] = {k: _json_number(v) for k, v in report.metrics.items()}
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


def _merge_training(old: dict[str, Any], report: Report, now: float) -> dict[str, Any]:
    new = dict(old)
    back = restarted(old, report)
    after_final = bool(old.get("final"))  # a new run of the program: the time in between is no training
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
    new["lastReportTime"] = format_time(now)
    if report.final:
        new["final"] = True
    else:
        new.pop("final", None)

    if report.metrics:
        latest = {k: _json_number(v) for k, v in report.metrics.items()}
        for name, value in (old.get("metrics") or {}).items():  # the latest value of each name
            if name not in latest and len(latest) < MAX_METRICS:
                latest[name] = value
        new["metrics"] = latest

    history = [dict(p) for p in old.get("history") or [] if isinstance(p, dict)]
    if back:
        history = [p for p in history if not _past(p, report)]
    _rates(new, old, report, history[-1] if history and not (back or after_final) else None, now, back or after_final)
    _add_point(history, report, now)
    new["history"] = history

    percent = _percent(new)
    if percent is None:
        new.pop("percent", None)
    else:
        new["percent"] = percent
    new["summary"] = _summary(new, percent)
    eta = _eta_seconds(new)
    if eta is None or (report.final and (percent or 0) < 100):
        new.pop("etaSeconds", None)
        new.pop("eta", None)
    else:
        new["etaSeconds"] = eta
        new["eta"] = duration(eta)
    return new


def _past(point: dict[str, Any], report: Report) -> bool:
    """A history point beyond where the restarted run resumed."""
    if report.step is not None and isinstance(point.get("step"), int):
        return bool(point["step"] > report.step)
    if report.epoch is not None and isinstance(point.get("epoch"), int):
        return bool(point["epoch"] > report.epoch)
    return True  # no way to place it on the new run's axis


def _ema(previous: Any, sample: float, dt: float) -> float:
    old = _finite(previous)
    if old is None:
        return sample
    weight = 1.0 - math.exp(-max(dt, 0.0) / RATE_TIME_CONSTANT)
    return old + weight * (sample - old)


def _rates(
    new: dict[str, Any], old: dict[str, Any], report: Report, last: dict[str, Any] | None, now: float, new_run: bool
) -> None:
    """``stepsPerSecond``/``examplesPerSecond`` as reported, else computed from the reports' steps over time (an
    average over about the last minute); ``secondsPerEpoch`` when only epochs are reported."""
    computed = False
    if report.steps_per_second is not None:
        new["stepsPerSecond"] = round(report.steps_per_second, 3)
    elif report.step is not None and last is not None and isinstance(last.get("step"), int):
        dt = now - (_finite(last.get("time")) or now)
        done = report.step - last["step"]
        if dt > 0 and done >= 0:
            new["stepsPerSecond"] = round(_ema(old.get("stepsPerSecond"), done / dt, dt), 3)
            computed = True
    if report.examples_per_second is not None:
        new["examplesPerSecond"] = round(report.examples_per_second, 3)
    elif computed:
        examples, steps = _finite(old.get("examplesPerSecond")), _finite(old.get("stepsPerSecond"))
        if examples is not None and steps:  # examples per step, from when both were reported
            new["examplesPerSecond"] = round(new["stepsPerSecond"] * examples / steps, 3)
    if report.step is None and new.get("step") is None and report.epoch is not None and not new_run:
        before, since = old.get("epoch"), _time(old.get("lastProgressTime"))
        if isinstance(before, int) and report.epoch > before and since is not None and now > since:
            sample = (now - since) / (report.epoch - before)
            spe = _finite(old.get("secondsPerEpoch"))
            new["secondsPerEpoch"] = round(sample if spe is None else (spe + sample) / 2, 3)


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
            point[name] = _json_number(report.metrics[name])
    if last is not None and (last.get("step"), last.get("epoch")) == (point.get("step"), point.get("epoch")):
        history[-1] = {**last, **point}  # the same place again (a final report): one point
        return
    history.append(point)
    while len(history) > HISTORY_POINTS:
        # Drop the point whose neighbours are closest in time: the points stay spread over the whole run.
        times = [_finite(p.get("time")) or 0.0 for p in history]
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


def _eta_seconds(progress: dict[str, Any]) -> int | None:
    step, steps, rate = progress.get("step"), progress.get("steps"), _finite(progress.get("stepsPerSecond"))
    if isinstance(step, int) and isinstance(steps, int):
        if step >= steps:
            return 0
        return round((steps - step) / rate) if rate else None
    epoch, epochs, spe = progress.get("epoch"), progress.get("epochs"), _finite(progress.get("secondsPerEpoch"))
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


def health(progress: dict[str, Any] | None, now: float, stall_seconds: float) -> list[tuple[str, str]]:
    """``(reason, message)`` for what is wrong with a running job's training: ``LossNotFinite`` (the latest loss,
    or any metric named ``*loss``, training or evaluation, is NaN or infinite), ``TrainingStalled`` (step and epoch
    have not moved for ``stall_seconds``). Empty when all is well or nothing was reported yet."""
    progress = _sane(progress)
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
    since = _time(progress.get("lastProgressTime"))
    if since is not None and not progress.get("final") and now - since > stall_seconds:
        last = _time(progress.get("lastReportTime"))
        if last is not None and now - last < stall_seconds:
            why = f"the program still reports (last {duration(now - last)} ago) but does not advance"
        else:
            why = f"no report for {duration(now - (last or since))}"
        out.append(
            ("TrainingStalled", f"no progress for {duration(now - since)}, still at {_position(progress)}: {why}")
        )
    return out


def _label(value: float) -> str:
    return f"{value:.4g}"


def curve(history: list[dict[str, Any]], metric: str, width: int = 60, height: int = 10) -> str:
    """A small ASCII chart of ``metric`` over the history's steps (else epochs, else report order)."""
    points = [p for p in history or [] if _finite(p.get(metric)) is not None]
    if not points:
        return f"{metric}: no values yet"
    if all(isinstance(p.get("step"), int) for p in points):
        axis, xs = "step", [float(p["step"]) for p in points]
    elif all(isinstance(p.get("epoch"), int) for p in points):
        axis, xs = "epoch", [float(p["epoch"]) for p in points]
    else:
        axis, xs = "report", [float(i) for i in range(len(points))]
    ys = [float(p[metric]) for p in points]
    width, height = max(10, width), max(3, height)
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    grid = [[" "] * width for _ in range(height)]

    def column(x: float) -> int:
        return 0 if x1 == x0 else math.floor((x - x0) / (x1 - x0) * (width - 1) + 0.5)

    def mark(col: int, y: float) -> None:
        grid[height - 1 - math.floor((y - y0) / (y1 - y0) * (height - 1) + 0.5)][col] = "*"

    pairs = sorted(zip(xs, ys, strict=True))
    for (xa, ya), (xb, yb) in itertools.pairwise(pairs):  # a line: every column between two points
        ca, cb = column(xa), column(xb)
        for col in range(ca, cb + 1):
            mark(col, ya if cb == ca else ya + (yb - ya) * (col - ca) / (cb - ca))
    for x, y in pairs:
        mark(column(x), y)
    middle = (height - 1) // 2
    labels = {0: _label(y1), height - 1: _label(y0), middle: _label(y1 - middle / (height - 1) * (y1 - y0))}
    pad_width = max(len(v) for v in labels.values())
    lines = [f"{metric} by {axis}"]
    for i, row_cells in enumerate(grid):
        lines.append(f"{labels.get(i, ''):>{pad_width}} |{''.join(row_cells).rstrip()}")
    lines.append(" " * pad_width + " +" + "-" * width)
    left, right = _label(x0), _label(x1)
    gap = max(1, width - len(left) - len(right))
    lines.append(" " * (pad_width + 2) + left + " " * gap + right + f" {axis}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- who reports: the endpoint's identity rules

AUDIENCE = "kubetf.io/progress"  # the projected token's audience: good for this endpoint and nothing else
TOKEN_PATH = "/var/run/secrets/kubetf.io/progress"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True)
class Reporter:
    """The pod a token is bound to, from a TokenReview the API server answered authenticated."""

    namespace: str
    pod: str
    uid: str


def reporter(review_status: dict[str, Any]) -> Reporter | None:
    """The pod a reviewed token was issued for; None when the token is not authenticated, or not bound to a pod
    (a service account's long-lived token would let any holder report for any job of its namespace)."""
    if not review_status.get("authenticated"):
        return None
    user = review_status.get("user") or {}
    parts = str(user.get("username") or "").split(":")
    extra = user.get("extra") or {}
    pod, uid = (extra.get(POD_NAME_EXTRA) or [None])[0], (extra.get(POD_UID_EXTRA) or [None])[0]
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"] or not pod or not uid:
        return None
    return Reporter(parts[2], pod, uid)


def task_of(pod_name: str, roles: Iterable[str]) -> tuple[str, str, int] | None:
    """(job, role, index) that a pod name `{job}-{role}-{index}` can stand for, for each role the operator knows;
    the caller checks the candidates against its own pods (the uid decides)."""
    for role in roles:
        match = re.fullmatch(rf"(.+)-{role}-(\d+)", pod_name)
        if match:
            return match.group(1), role, int(match.group(2))
    return None


def coordinator(job: dict[str, Any], role: str, index: int) -> bool:
    """The task whose reports are the job's training progress: the chief, else worker 0."""
    chief = ((job.get("spec") or {}).get("replicaSpecs") or {}).get("chief") or {}
    if chief.get("replicas", 0) > 0:
        return role == "chief"
    return role == "worker" and index == 0


# ---------------------------------------------------------------------- the job's training health, in its status

UNHEALTHY = "TrainingUnhealthy"  # a condition beside the phases: True with a reason while health() finds one
HEALTH_REASONS = ("LossNotFinite", "TrainingStalled")


def judge_training(plan: Plan, now: float, stall_seconds: float) -> None:
    """Set or clear the TrainingUnhealthy condition of the planned status from its `progress`, with a Warning event
    for what newly went wrong and a wake-up when a stall falls due. Only a running job is judged: a queued,
    restarting or finished job is not training, and its condition is cleared."""
    status = plan.status
    running = status.get("phase") == "Running"
    found = health(status.get("progress"), now, stall_seconds) if running else []
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
    if conditions:
        status["conditions"] = conditions
    plan.events += [Event("Warning", reason, message) for reason, message in events]
    since = _time((status.get("progress") or {}).get("lastProgressTime")) if running else None
    if since is not None and since + stall_seconds >= now:
        plan.wake_at(since + stall_seconds + 1)
