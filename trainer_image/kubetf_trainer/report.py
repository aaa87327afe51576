"""Progress reports from a training program to the kubetf operator (protocol v1): the client side.

    from kubetf_trainer.report import report
    report(epoch=3, epochs=10, step=1200, steps=4000, metrics={"loss": 0.31, "accuracy": 0.91})

The operator puts how far a job is into the TrainingJob's ``status.progress`` (``kubectl get tj`` shows it).
This module is standard library only and does not import TensorFlow: copy this one file into any image, or
``pip install`` the kubetf project and import ``kubetf_trainer.report``.

- ``report(...)`` never blocks and never raises: it records the latest state and a background thread sends it,
  at most one POST per ``KUBETF_PROGRESS_INTERVAL`` seconds (default 5). The first report, a new epoch and
  ``final`` go out at once. A report that cannot be delivered now (503: this operator replica is not the leader,
  429, a connection error) is retried a few times with a short backoff, then again with the next report; a 503 is
  first retried at once (a new connection may reach the leader behind the same Service).
- Only the task that coordinates training sends (the chief, else worker 0), and the evaluator; on any other task
  (and when ``KUBETF_PROGRESS_URL`` is unset, as under ``kubetf local``) ``report`` does nothing. So the same
  program can call it on every task.
- At exit the last state goes out synchronously with ``"final": true`` (at most ``FINAL_TIMEOUT`` seconds).
- Each kind of failure is logged once (logger ``kubetf_trainer.report``), not once per report.

The wire format (POST ``$KUBETF_PROGRESS_URL``, ``Authorization: Bearer <the token in
$KUBETF_PROGRESS_TOKEN_FILE, read anew for each request>``, JSON of at most 16 KiB)::

    {"epoch": 3, "epochs": 10, "step": 1200, "steps": 4000, "metrics": {"loss": 0.31, "accuracy": 0.91},
     "stepsPerSecond": 12.5, "examplesPerSecond": 800.0, "final": false}
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Reporter", "auto_report", "enabled", "flush", "interval", "report", "reporter", "task_kind"]

ENV_URL = "KUBETF_PROGRESS_URL"
ENV_TOKEN_FILE = "KUBETF_PROGRESS_TOKEN_FILE"
ENV_INTERVAL = "KUBETF_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 5.0
MAX_BODY = 16 * 1024
MAX_METRICS = 32
NAME_RE = re.compile(r"[A-Za-z0-9_./-]{1,64}")
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_./-]")
RATE_FIELDS = {
    "stepsPerSecond": "stepsPerSecond",
    "examplesPerSecond": "examplesPerSecond",
    "steps_per_second": "stepsPerSecond",
    "examples_per_second": "examplesPerSecond",
}
RETRY_STATUS = {429, 502, 503, 504}  # slow down / not the leader / a proxy in between: try again
OFF_STATUS = {403, 404}  # not a training pod of a TrainingJob / no such endpoint: nothing will ever be accepted
REQUEST_TIMEOUT = 5.0
FINAL_TIMEOUT = 3.0
RETRIES = 3
BACKOFF = 0.5
# 503 retried at once, this many times, before the backoff: behind the operator's Service the standby answers 503
# ("not the leader") and the next connection may reach the leader. With two replicas a report met the standby on
# each of the exit-time flush's three tries within FINAL_TIMEOUT once in eight runs: the job Succeeded at 90%.
REROUTES = 8
URGENT_SPACING = 1.0  # epoch ends go out at once, but never more than once a second

log = logging.getLogger("kubetf_trainer.report")


def task_kind(environ: Mapping[str, str] | None = None) -> str | None:
    """``"training"`` for the task that coordinates training (the chief, else worker 0 when the cluster has no
    chief: the same rule as ``kubetf_trainer.env.TaskInfo.is_chief``), ``"evaluation"`` for the evaluator,
    ``None`` for every other task (they send nothing)."""
    env = os.environ if environ is None else environ
    try:
        tf_config = json.loads(env.get("TF_CONFIG") or "{}")
    except ValueError:
        tf_config = {}
    if not isinstance(tf_config, dict):
        tf_config = {}
    cluster = tf_config.get("cluster") or {}
    task = tf_config.get("task") or {}
    role = env.get("KUBETF_ROLE") or task.get("type") or "worker"
    try:
        index = int(env.get("KUBETF_INDEX") or task.get("index") or 0)
    except (TypeError, ValueError):
        index = -1
    if role == "evaluator":
        return "evaluation"
    if role == "chief" or (
        role == "worker" and index == 0 and not (isinstance(cluster, dict) and cluster.get("chief"))
    ):
        return "training"
    return None


def _number(value: Any) -> float | None:
    """A float from Python/numpy/TensorFlow scalars; None for anything else (bools included)."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        return None
    if not isinstance(value, (int, float)):
        item = getattr(value, "item", None)  # numpy scalars, 0-d arrays
        if callable(item):
            try:
                value = item()
            except (TypeError, ValueError):
                return None
        elif hasattr(value, "numpy"):  # eager tensors
            try:
                value = value.numpy().item()
            except Exception:
                return None
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _wire(value: float) -> float | str:
    """JSON has no NaN: non-finite values travel as the strings "NaN", "Infinity", "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def metric_name(name: Any) -> str | None:
    """The protocol's name (``[A-Za-z0-9_./-]{1,64}``): other characters become ``_``, longer names are cut."""
    text = _BAD_NAME_CHARS.sub("_", str(name))[:64]
    return text if NAME_RE.fullmatch(text) else None


class Reporter:
    """One sender: the latest state, a background thread, and the final report at exit.

    ``report()`` is the only method a training loop calls; it takes a lock for a few dictionary operations.
    """

    def __init__(
        self,
        url: str,
        token_file: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        *,
        timeout: float = REQUEST_TIMEOUT,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
        final_timeout: float = FINAL_TIMEOUT,
        at_exit: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = url
        self.token_file = token_file or None
        self.interval = max(0.0, float(interval))
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.final_timeout = final_timeout
        self._at_exit = at_exit
        self._clock = clock
        self._cond = threading.Condition()
        self._position: dict[str, int] = {}  # epoch, epochs, step, steps: always sent, so a lost report loses no place
        self._pending: dict[str, Any] | None = None  # metrics, rates and final not sent yet
        self._urgent = False
        self._taken_any = False  # the sender took a report (the first one goes out at once)
        self._taken_epoch: int | None = None  # the epoch of the last report taken for sending
        self._final_delivered = False
        self._next_due = 0.0  # no regular send before this (clock)
        self._next_urgent = 0.0
        self._sending = False
        self._closing = False
        self._disabled = False
        self._thread: threading.Thread | None = None
        self._logged: set[str] = set()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # an in-cluster Service
        self.pid = os.getpid()
        self.sent = 0  # POSTs answered 204 (for tests and curiosity)

    # -- the program's side ------------------------------------------------------------------------------------

    def report(
        self,
        epoch: int | None = None,
        epochs: int | None = None,
        step: int | None = None,
        steps: int | None = None,
        metrics: Mapping[str, Any] | None = None,
        final: bool = False,
        **rates: Any,
    ) -> None:
        try:
            self._report(epoch, epochs, step, steps, metrics, final, rates)
        except Exception as exc:  # never into the training program
            self._log_once(
                "internal",
                "kubetf progress: report() failed (%s: %s); progress may be incomplete",
                type(exc).__name__,
                exc,
            )

    def _report(
        self,
        epoch: Any,
        epochs: Any,
        step: Any,
        steps: Any,
        metrics: Mapping[str, Any] | None,
        final: bool,
        rates: dict[str, Any],
    ) -> None:
        if self._disabled:
            return
        position: dict[str, int] = {}
        for key, value, least in (("epoch", epoch, 0), ("epochs", epochs, 1), ("step", step, 0), ("steps", steps, 1)):
            if value is None:
                continue
            number = _number(value)
            if number is None or not math.isfinite(number) or number < least or number != int(number):
                self._log_once(
                    f"field-{key}", "kubetf progress: %s=%r is not a whole number >= %d; left out", key, value, least
                )
                continue
            position[key] = int(number)
        body: dict[str, Any] = {}
        if metrics:
            body["metrics"] = self._metrics(metrics)
        for key, value in rates.items():
            wire_key = RATE_FIELDS.get(key)
            number = _number(value)
            if wire_key is None:
                self._log_once(f"arg-{key}", "kubetf progress: report() has no argument %r; ignored", key)
            elif number is None or not math.isfinite(number) or number < 0:
                self._log_once(
                    f"field-{key}", "kubetf progress: %s=%r is not a non-negative number; left out", key, value
                )
            else:
                body[wire_key] = number
        with self._cond:
            if os.getpid() != self.pid:  # a forked child has no sender thread
                return
            merged = {**self._position, **position}
            if "epoch" not in merged and "step" not in merged:
                self._log_once("no-position", "kubetf progress: a report needs epoch or step; dropped")
                return
            if "epoch" in position and position["epoch"] != self._taken_epoch:
                self._urgent = True
            if not self._taken_any or final:
                self._urgent = True
            self._position = merged
            self._pending = _merge_body(self._pending, body)
            if final:
                self._pending["final"] = True
            self._start()
            self._cond.notify_all()

    def _metrics(self, metrics: Mapping[str, Any]) -> dict[str, float | str]:
        out: dict[str, float | str] = {}
        for raw_name, raw_value in metrics.items():
            name = metric_name(raw_name)
            value = _number(raw_value)
            if name is None:
                self._log_once("metric-name", "kubetf progress: metric name %r cannot be sent; left out", raw_name)
                continue
            if value is None:
                self._log_once(
                    f"metric-{name}", "kubetf progress: metric %s=%r is not a number; left out", name, raw_value
                )
                continue
            if len(out) >= MAX_METRICS and name not in out:
                self._log_once(
                    "metric-count",
                    "kubetf progress: more than %d metrics; only the first %d are sent",
                    MAX_METRICS,
                    MAX_METRICS,
                )
                continue
            out[name] = _wire(value)
        return out

    def flush(self, timeout: float | None = None, final: bool = False) -> bool:
        """Send what is pending now, in this thread, within ``timeout`` seconds (default ``final_timeout``).
        ``final``: mark it as the run's last report, and stop the background sender. Returns whether the
        operator accepted it (True also when there was nothing to send)."""
        try:
            return self._flush(self.final_timeout if timeout is None else timeout, final)
        except Exception as exc:
            self._log_once("internal", "kubetf progress: flush failed (%s: %s)", type(exc).__name__, exc)
            return False

    def _flush(self, timeout: float, final: bool) -> bool:
        deadline = self._clock() + timeout
        with self._cond:
            if os.getpid() != self.pid or self._disabled:
                return False
            if final:
                self._closing = True
                self._cond.notify_all()
            while self._sending and self._clock() < deadline:  # the sender thread is mid-request
                self._cond.wait(max(0.01, deadline - self._clock()))
            if self._sending or self._disabled:
                return False
            if not self._position or (self._pending is None and (not final or self._final_delivered)):
                return True
            pending = _merge_body(self._pending, {"final": True} if final else {})
            self._pending = None
            self._urgent = False
            self._sending = True
            body = self._take(pending)
        try:
            ok = self._deliver(body, deadline)
        finally:
            with self._cond:
                self._sending = False
                self._cond.notify_all()
        return ok

    def stop(self) -> None:
        """Stop sending: the background sender ends, what is pending is dropped, nothing goes out at exit."""
        with self._cond:
            self._closing = self._disabled = True
            self._cond.notify_all()

    def _at_exit_flush(self) -> None:
        self.flush(final=True)

    # -- the sender thread -------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kubetf-progress", daemon=True)
        self._thread.start()
        if self._at_exit:
            atexit.register(self._at_exit_flush)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closing or self._disabled:
                        return
                    now = self._clock()
                    if self._pending is not None:
                        due = self._next_urgent if self._urgent else self._next_due
                        if now >= due:
                            break
                        self._cond.wait(due - now)
                    else:
                        self._cond.wait()
                pending, self._pending, self._urgent = self._pending, None, False
                self._sending = True
                body = self._take(pending)
            try:
                self._deliver(body, None)
            except Exception as exc:
                self._log_once("internal", "kubetf progress: sender failed (%s: %s)", type(exc).__name__, exc)
            finally:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()

    def _take(self, pending: dict[str, Any]) -> dict[str, Any]:
        """The body to send now (under the lock)."""
        self._taken_any = True
        self._taken_epoch = self._position.get("epoch", self._taken_epoch)
        return self._compose(pending)

    def _compose(self, pending: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = dict(self._position)
        body.update(pending)
        body["final"] = bool(pending.get("final"))
        return body

    def _deliver(self, body: dict[str, Any], deadline: float | None) -> bool:
        """POST ``body``, retrying what may work a moment later; False when it was not accepted. ``deadline``:
        the exit-time flush's; None in the sender thread, which then keeps what failed for the next try."""
        attempt = reroutes = 0
        while True:
            status, reason, retry_after = self._post(body, deadline)
            now = self._clock()
            in_time = now < deadline if deadline is not None else not self._closing
            if status == 503 and reroutes < REROUTES and in_time:
                reroutes += 1
                continue
            with self._cond:
                if status == 204:
                    self.sent += 1
                    self._final_delivered = bool(body.get("final"))
                    self._next_due = now + self.interval
                    self._next_urgent = now + min(self.interval, URGENT_SPACING)
                    return True
                if status in OFF_STATUS:
                    self._disabled = True
                    self._cond.notify_all()
                    self._log_once(
                        f"http-{status}",
                        "kubetf progress: %s answered %s (%s); no more reports from this process",
                        self.url,
                        status,
                        reason,
                    )
                    return False
                if status is not None and status not in RETRY_STATUS:  # 400, 401, 413: this report as it is
                    self._log_once(
                        f"http-{status}", "kubetf progress: %s refused a report: %s %s", self.url, status, reason
                    )
                    return False
                wait = min(self.backoff * 2**attempt, 5.0)
                if status == 429 and retry_after:
                    wait = max(wait, min(retry_after, 5.0))
                attempt += 1
                out_of_time = deadline is not None and now + wait >= deadline
                if attempt > self.retries or out_of_time or (deadline is None and self._closing):
                    kind = "connection" if status is None else f"http-{status}"
                    self._log_once(
                        kind,
                        "kubetf progress: cannot deliver to %s (%s); trying again with later reports",
                        self.url,
                        reason,
                    )
                    if deadline is None:  # the sender: keep it for the next try (or for the exit-time flush)
                        self._pending = _merge_body(_extras(body), self._pending or {})
                        later = now + max(self.interval, retry_after or 0.0)
                        self._next_due = max(self._next_due, later)
                        self._next_urgent = max(self._next_urgent, later)
                    return False
                self._cond.wait(wait)  # a newer report may come in meanwhile
                if deadline is None and self._closing:  # the exit-time flush takes over
                    self._pending = _merge_body(_extras(body), self._pending or {})
                    return False
                if deadline is None and self._pending is not None:
                    body = self._take(_merge_body(_extras(body), self._pending))
                    self._pending, self._urgent = None, False

    def _post(self, body: dict[str, Any], deadline: float | None) -> tuple[int | None, str, float | None]:
        """(HTTP status or None for no answer, a reason, Retry-After seconds)."""
        data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        if len(data) > MAX_BODY:
            self._log_once(
                "too-large",
                "kubetf progress: a report of %d bytes is over %d; sent without metrics",
                len(data),
                MAX_BODY,
            )
            body = {k: v for k, v in body.items() if k != "metrics"}
            data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        headers = {"Content-Type": "application/json"}
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as exc:
                self._log_once("token", "kubetf progress: cannot read the token %s: %s", self.token_file, exc)
                return None, f"no token: {exc}", None
            headers["Authorization"] = f"Bearer {token}"
        timeout = self.timeout
        if deadline is not None:
            timeout = max(0.05, min(timeout, deadline - self._clock()))
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return response.status, "", None
        except urllib.error.HTTPError as exc:
            reason = str(exc.reason)
            try:
                detail = json.loads(exc.read(1024) or b"{}")
                if isinstance(detail, dict) and detail.get("error"):
                    reason = str(detail["error"])
            except Exception:
                pass
            retry_after = None
            with contextlib.suppress(TypeError, ValueError):
                retry_after = float(exc.headers.get("Retry-After") or 0) or None
            return exc.code, reason, retry_after
        except Exception as exc:  # URLError, timeouts, resets
            return None, f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}", None

    def _log_once(self, kind: str, message: str, *args: Any) -> None:
        if kind in self._logged:
            return
        self._logged.add(kind)
        with contextlib.suppress(Exception):
            log.warning(message + " (logged once)", *args)


def _extras(body: dict[str, Any]) -> dict[str, Any]:
    """What a body carries besides the position (which is always sent from the latest state)."""
    return {k: v for k, v in body.items() if k not in ("epoch", "epochs", "step", "steps")}


def _merge_body(older: dict[str, Any] | None, newer: dict[str, Any]) -> dict[str, Any]:
    out = dict(older or {})
    for key, value in newer.items():
        if key == "metrics":
            out["metrics"] = {**out.get("metrics", {}), **value}
        elif key == "final":
            out["final"] = bool(out.get("final")) or bool(value)
        else:
            out[key] = value
    return out


_lock = threading.Lock()
_reporter: Reporter | None = None
_configured_pid: int | None = None
_explicit = False  # the program called report() itself


def reporter() -> Reporter | None:
    """This process's reporter: None when ``KUBETF_PROGRESS_URL`` is unset or this task sends nothing."""
    global _reporter, _configured_pid
    pid = os.getpid()
    if _configured_pid == pid:
        return _reporter
    with _lock:
        if _configured_pid != pid:
            _reporter = None
            url = os.environ.get(ENV_URL, "").strip()
            if url and task_kind() is not None:
                try:
                    interval = float(os.environ.get(ENV_INTERVAL) or DEFAULT_INTERVAL)
                except ValueError:
                    interval = DEFAULT_INTERVAL
                if not math.isfinite(interval) or interval < 0:
                    interval = DEFAULT_INTERVAL
                _reporter = Reporter(url, os.environ.get(ENV_TOKEN_FILE), interval)
            _configured_pid = pid
    return _reporter


def enabled() -> bool:
    """Whether ``report`` sends anything from this process."""
    return reporter() is not None


def interval() -> float:
    """Seconds between reports (``KUBETF_PROGRESS_INTERVAL``); callers use it to skip work between reports."""
    r = reporter()
    return r.interval if r is not None else DEFAULT_INTERVAL


def report(
    epoch: int | None = None,
    epochs: int | None = None,
    step: int | None = None,
    steps: int | None = None,
    metrics: Mapping[str, Any] | None = None,
    final: bool = False,
    **rates: Any,
) -> None:
    """Report progress: ``epoch`` = finished epochs, ``epochs`` = total, ``step`` = global steps done, ``steps``
    = total, ``metrics`` = name -> number (NaN/inf allowed), ``final`` = this run's last report; rates as
    ``stepsPerSecond=`` / ``examplesPerSecond=`` (or ``steps_per_second=`` / ``examples_per_second=``).
    Fields left out keep their last value. Never blocks, never raises; a no-op without ``KUBETF_PROGRESS_URL``.

    A program that calls it takes over: the trainer image's automatic reports (``kubetf_trainer.autoreport``:
    ``Model.fit`` and the guides' printed lines) stop, so two sources never disagree about the step."""
    global _explicit
    _explicit = True
    _send(epoch, epochs, step, steps, metrics, final, rates)


def auto_report(
    epoch: int | None = None,
    epochs: int | None = None,
    step: int | None = None,
    steps: int | None = None,
    metrics: Mapping[str, Any] | None = None,
    final: bool = False,
    **rates: Any,
) -> None:
    """`report` for what the image derives by itself from an unchanged program: dropped once the program reported
    on its own."""
    if not _explicit:
        _send(epoch, epochs, step, steps, metrics, final, rates)


def _send(
    epoch: Any,
    epochs: Any,
    step: Any,
    steps: Any,
    metrics: Mapping[str, Any] | None,
    final: bool,
    rates: dict[str, Any],
) -> None:
    try:
        r = reporter()
    except Exception:
        return
    if r is not None:
        r.report(epoch, epochs, step, steps, metrics, final, **rates)


def flush(timeout: float = FINAL_TIMEOUT, final: bool = False) -> bool:
    """Deliver the pending report now (blocking, at most ``timeout`` seconds). Call it with ``final=True``
    before ``os._exit``, which skips the exit-time report."""
    r = _reporter if _configured_pid == os.getpid() else None
    return True if r is None else r.flush(timeout, final)
