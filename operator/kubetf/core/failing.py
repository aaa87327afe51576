"""A job whose reconcile keeps failing says so: the ReconcileError condition, beside the phase, with the API
server's own words, once `reconcile_error_after` attempts in a row have failed; cleared by the first reconcile that
succeeds. The failures themselves are retried with the job's backoff (kubetf.runtime.controller): the condition
only makes them visible to the user (`kubectl describe tj`), who may be the one who can fix them (a webhook that
refuses deletes, a quota on events)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubetf.core.status import format_time

RECONCILE_ERROR = "ReconcileError"
PREFIX = "the operator's reconciles of this job keep failing (retried with backoff); the last error: "


@dataclass(frozen=True)
class Failing:
    """The job's reconciles that failed in a row, and the last error's message."""

    attempts: int
    message: str


def mark(status: dict[str, Any], failing: Failing | None, after: int, now: float) -> str | None:
    """Set (`failing` for at least `after` attempts) or clear (no failure) the ReconcileError condition of
    `status`, in place. Returns the message of a Warning event when it turned True (or its message changed), else
    None."""
    conditions = [dict(c) for c in status.get("conditions") or []]
    current = next((c for c in conditions if c.get("type") == RECONCILE_ERROR), None)
    event = None
    if failing is not None and failing.attempts >= after:
        message = f"{PREFIX}{failing.message}"
        if current is None:
            current = {"type": RECONCILE_ERROR}
            conditions.append(current)
        if current.get("status") != "True":
            current["lastTransitionTime"] = format_time(now)
            event = message
        elif current.get("message") != message:
            event = message
        current.update(status="True", reason=RECONCILE_ERROR, message=message)
    elif failing is None and current is not None and current.get("status") == "True":
        current.update(
            status="False", reason="Reconciled", message="the last reconcile succeeded",
            lastTransitionTime=format_time(now),
        )  # fmt: skip
    else:
        return None
    status["conditions"] = conditions
    return event
