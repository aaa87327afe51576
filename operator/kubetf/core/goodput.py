"""Goodput, pure: how much of a job's wall time trained, and what the rest went to, by cause.

A job's wall time runs from its creation to its end (or now). Each moment of it is in one state, kept in
`status.goodput` as the state now and since when (`state`, `since`) and the seconds of the states closed before:

| state | while |
|---|---|
| `training` | its training steps move, since the first step of the current run |
| `queued` | Kueue keeps it queued (no pod) |
| `gangWaiting` | its gang waits to be placed |
| `starting` | from its start (or a suspension's end, or an admission no restart came before) to the first step |
| `restarting` | a disruption or a failure (a queue's preemption too) until the first training step after it |
| `suspended` | suspended by its user |

and one cause that is never a state: `redone`, the training a restart threw away (the steps since the checkpoint it
resumed from), moved out of `training` once the resumed run reports where it went back to.

The sums add up to the wall time by construction: a transition closes the open state at the moment it is known to
have ended (a restart's time, the first step's report, the gang placed), never later than now. `trainingSince` keeps
when the latest training began (the first step after a start or a restart): the time to resume of a restart ends
there, and a restart training came after is over (an hour's suspension later is no restart's). The status changes
only at transitions, and with any write the job makes anyway (`refresh`): a job that trains quietly costs no write.
`live` gives what a reader sees now (the open state counted up to now): `kubetf status`, the metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kubetf.core import status as st

TRAINING = "training"
ENDED = "ended"
LOST = ("queued", "gangWaiting", "starting", "restarting", "redone", "suspended")


@dataclass(frozen=True)
class Goodput:
    """A job's goodput at an instant."""

    wall: float
    training: float
    lost: dict[str, float]

    @property
    def ratio(self) -> float:
        """Of the time accounted (the wall time, but for a clock of the operator's behind the API server's, which
        stamped the job's creation): never above 1."""
        accounted = self.training + sum(self.lost.values())
        return self.training / accounted if accounted > 0 else 0.0

    def summary(self) -> str:
        """`87% (restarting 2m, queued 40s)`: the share that trained, then the largest losses."""
        losses = sorted(((s, c) for c, s in self.lost.items() if s >= 1), reverse=True)[:2]
        words = ", ".join(f"{c} {duration(s)}" for s, c in losses)
        return f"{self.ratio:.0%}" + (f" ({words})" if words else "")


def run_began(status: dict[str, Any]) -> float | None:
    """When the job's current run began: its latest restart, or the start of its current active period (admitted,
    resumed), whichever came last. The first report after it is the run's first step (kubetf.core.progress.merge)."""
    restarted = st.parse_time((status.get("restarts") or {}).get("lastTime"))
    active = st.parse_time(status.get("activeSince"))
    return max((t for t in (restarted, active) if t is not None), default=None)


def state(status: dict[str, Any], progress: dict[str, Any] | None = None) -> tuple[str | None, float | None]:
    """The state the job is in now (None: it ended) and since when, as far as the status and its freshest progress
    (the operator's, newer than the status until written; default the status's) say."""
    phase = status.get("phase")
    if phase in st.FINISHED:
        return None, st.parse_time(status.get("completionTime"))
    if phase == st.QUEUED:
        return "queued", st.parse_time(status.get("queuedSince"))
    if phase == st.SUSPENDED:
        return "suspended", None
    run = run_began(status)
    progress = (progress if progress is not None else status.get("progress")) or {}
    moved = st.parse_time(progress.get("lastProgressTime"))
    began = st.parse_time(progress.get("runStartTime"))  # the current run's first report (progress.merge)
    if moved is not None and (run is None or moved > run):  # a parameter server job trains while a worker waits
        return TRAINING, began if began is not None and (run is None or began > run) else moved
    gang = status.get("gang") or {}
    if gang.get("waitingSince") and not gang.get("placedAt"):
        return "gangWaiting", st.parse_time(gang["waitingSince"])
    placed = st.parse_time(gang.get("placedAt"))  # a gang waited: starting begins once it is placed
    began_starting = max((t for t in (run, placed) if t is not None), default=None)
    return ("restarting" if unresumed(status) is not None else "starting"), began_starting


def unresumed(status: dict[str, Any]) -> float | None:
    """The time of the job's latest restart while no training has come after it, else None."""
    restarted = st.parse_time((status.get("restarts") or {}).get("lastTime"))
    trained = st.parse_time((status.get("goodput") or {}).get("trainingSince"))
    return restarted if restarted is not None and (trained is None or trained < restarted) else None


def account(
    status: dict[str, Any], created: float | None, now: float, refresh: bool, progress: dict[str, Any] | None = None
) -> None:
    """Bring `status.goodput` to `now`: close the open state when the job left it (at the moment it did), open the
    new one; with `refresh` (the status is written anyway), count the open state up to now and say the ratio."""
    found = dict(status.get("goodput") or {})
    new, at = state(status, progress)
    # `since` is kept in whole seconds (RFC 3339): every boundary is taken at a whole second, so an interval counted
    # once is never counted again from a rounded-down `since` (the remainder goes with the next one).
    now = float(math.floor(now))
    at = float(math.floor(at)) if at is not None else None
    start = float(math.floor(created)) if created is not None else now
    since = st.parse_time(found.get("since")) or start
    now = max(now, since)  # a leader whose clock is behind the last one's never counts a moment again
    # First seen (a new job; or one from before goodput was kept, whose past is taken for what it is now)
    current = found.get("state") or new or ENDED
    seconds: dict[str, float] = {k: float(v) for k, v in (found.get("seconds") or {}).items()}
    at = min(max(at if at is not None else now, since), now)
    fresh = progress if progress is not None else status.get("progress") or {}
    began = _new_run(fresh, found, current, new, at, now)
    if began is not None:
        # The run's first step came while the job was starting: training since then (before this reconcile saw it,
        # and even if it ended again before: a restart the same reconcile saw). Counted back from the open state's.
        began = max(began, since - seconds.get(current, 0.0))
        if began < since:
            seconds[current] -= since - began
        _add(seconds, current, began - since)
        since, current = began, TRAINING
        found["trainingSince"] = st.format_time(began)
    moved = (new or ENDED) != current
    if moved:
        _add(seconds, current, at - since)
        since, current = at, new or ENDED
        if current == TRAINING:
            found["trainingSince"] = st.format_time(at)
    if refresh and new is not None:
        _add(seconds, current, now - since)
        since = now
    _redone(fresh, seconds, found)
    found.update(state=current, since=st.format_time(since), seconds={k: round(v, 1) for k, v in seconds.items()})
    if refresh or moved or "ratio" not in found:
        view = live(dict(status, goodput=found), created, now)
        found["ratio"], found["percent"], found["summary"] = round(view.ratio, 3), f"{view.ratio:.0%}", view.summary()
    status["goodput"] = found


def _new_run(
    progress: dict[str, Any], found: dict[str, Any], current: str, new: str | None, at: float, now: float
) -> float | None:
    """When the current run's first step came (whole seconds), if it came while the job was starting or restarting
    and no training was counted since: before the state it went to next, if any."""
    began = st.parse_time(progress.get("runStartTime"))
    trained = st.parse_time(found.get("trainingSince"))
    if current not in ("starting", "restarting") or began is None or (trained is not None and began <= trained):
        return None
    began = float(math.floor(began))
    return began if began <= (now if new == TRAINING else at) else None


def _redone(progress: dict[str, Any], seconds: dict[str, float], found: dict[str, Any]) -> None:
    """Once the first report after a restart says the run went back (kubetf.core.progress.merge: `resumedFrom`, with
    how long the old run had taken over the steps redone), that time moves from training to redone (at most what
    trained), once per restart."""
    back = progress.get("resumedFrom") or {}
    mark = back.get("at")
    if not mark or found.get("redoneAt") == mark:
        return
    redone = min(seconds.get(TRAINING, 0.0), float(back.get("lostSeconds") or 0.0))
    seconds[TRAINING] = seconds.get(TRAINING, 0.0) - redone
    _add(seconds, "redone", redone)
    found["redoneAt"] = mark


def _add(seconds: dict[str, float], key: str, value: float) -> None:
    if key in (TRAINING, *LOST) and value > 0:
        seconds[key] = seconds.get(key, 0.0) + value


def live(status: dict[str, Any], created: float | None, now: float) -> Goodput:
    """What a reader sees now: the closed states, and the open one counted up to now (the end, once ended)."""
    found = status.get("goodput") or {}
    seconds = {k: float(v) for k, v in (found.get("seconds") or {}).items()}
    end = st.parse_time(status.get("completionTime")) if status.get("phase") in st.FINISHED else None
    since = st.parse_time(found.get("since"))
    if since is not None and found.get("state") in (TRAINING, *LOST):
        _add(seconds, found["state"], (end or now) - since)
    start = created if created is not None else since or now
    wall = max(0.0, (end or now) - start)
    return Goodput(wall, seconds.get(TRAINING, 0.0), {c: seconds.get(c, 0.0) for c in LOST})


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
