"""What a training pod sends to the operator (protocol v1), and how a request body becomes a `Report`.

A report (``POST /v1/progress``, JSON, at most 16 KiB)::

    {"epoch": 3, "epochs": 10, "step": 1200, "steps": 4000, "metrics": {"loss": 0.31, "accuracy": 0.91},
     "stepsPerSecond": 12.5, "examplesPerSecond": 800.0, "final": false}

Every field is optional but one of ``epoch`` (finished epochs) and ``step`` (global steps done). Metric values are
numbers or the strings "NaN", "Infinity", "-Infinity" (JSON has no NaN). `status.progress` keeps non-finite values as
those strings, since the API server stores JSON too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

PATH = "/v1/progress"
MAX_BODY = 16 * 1024
MAX_METRICS = 32
METRIC_NAME = re.compile(r"[A-Za-z0-9_./-]{1,64}")
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
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


def json_number(value: float) -> float | str:
    """Six significant digits; NaN and infinities as the protocol's strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(f"{value:.6g}")


def finite(value: Any) -> float | None:
    """The value as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def number(value: Any) -> float | None:
    """A stored metric value as a float: the protocol's strings for NaN and the infinities too; None otherwise."""
    if isinstance(value, str):
        return NON_FINITE.get(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
