"""Progress reports from Keras' ``Model.fit``: the part shared by the library's ``Progress`` callback and the
callback the trainer image adds to unchanged programs (``kubetf_trainer.autoreport``).

No TensorFlow import here: ``callback_class(base)`` builds the callback on whichever Keras ``Callback`` base the
program uses (tf-keras or Keras 3).

Steps: the first ``fit`` of a process counts epochs x steps per epoch (a run resumed by ``BackupAndRestore`` at
epoch K starts at K x steps per epoch); a later ``fit`` in the same process (fine-tuning after training a head) goes
on from where the previous one ended, so the step never goes back within a process.

What is reported: at each epoch end (``epoch`` = finished epochs, ``step`` = global steps, the epoch's logs:
loss, metrics, ``val_*``), and within an epoch every ``KUBETF_PROGRESS_INTERVAL`` seconds from
``on_train_batch_end`` (the running loss and metrics of the epoch so far). A batch costs one clock read; the logs
(tensors: ``_supports_tf_logs``, so Keras does not copy them to numpy for us each batch) are read only when a report
is due. Under ParameterServerStrategy batch-level logs are not known yet when the hook runs: epoch ends only.
"""

from __future__ import annotations

import time
from typing import Any

from . import report as _report

_SKIP_LOGS = {"batch", "size", "num_steps"}
_last_step: int | None = None  # the last step a fit of this process reported: a later fit goes on from it


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


class ReportingMixin:
    """Mixed into a Keras ``Callback``; the class calls the ``_kt_*`` methods from its hooks."""

    kubetf_progress_reporter = True  # the image's fit hook adds no second reporter next to this one
    _kt_auto = False  # True for the image's automatic callback (yields to a program's own report() calls)

    params: Any
    model: Any

    def _kt_reset(self) -> None:
        self._kt_on = False
        self._kt_batches = False
        self._kt_interval = _report.DEFAULT_INTERVAL
        self._kt_next = 0.0
        self._kt_epochs: int | None = None
        self._kt_spe: int | None = None
        self._kt_epoch = 0
        self._kt_batch = -1
        self._kt_first_epoch: int | None = None  # the epoch this fit started at
        self._kt_base = 0  # the global step when this fit started
        self._kt_steps_before = 0  # the global step when the current epoch started
        self._kt_last: tuple[int, float] | None = None

    def _kt_send(self, **fields: Any) -> None:
        (_report.auto_report if self._kt_auto else _report.report)(**fields)

    def _kt_guard(self, what: str, func: Any, *args: Any) -> None:
        try:
            func(*args)
        except Exception as exc:  # a report is never worth a failed fit
            self._kt_on = self._kt_batches = False
            r = _report.reporter()
            if r is not None:
                r._log_once(
                    f"keras-{what}",
                    "kubetf progress: the Keras callback failed in %s (%s: %s); it stops reporting",
                    what,
                    type(exc).__name__,
                    exc,
                )

    def _kt_train_begin(self, coordinator: bool = True) -> None:
        self._kt_guard("on_train_begin", self._kt_train_begin_, coordinator)

    def _kt_train_begin_(self, coordinator: bool) -> None:
        self._kt_reset()
        self._kt_on = bool(coordinator) and _report.task_kind() == "training" and _report.enabled()
        if not self._kt_on:
            return
        params = self.params or {}
        self._kt_epochs = _int(params.get("epochs"))
        self._kt_spe = _int(params.get("steps"))
        strategy = getattr(self.model, "distribute_strategy", None)
        self._kt_batches = not getattr(strategy, "_should_use_with_coordinator", False)
        self._kt_interval = _report.interval()
        self._kt_next = time.monotonic() + self._kt_interval
        if _last_step is not None:
            self._kt_base = _last_step
        elif self._kt_spe is None:  # no steps per epoch: count from the optimizer's (restored) iterations
            try:
                self._kt_base = int(self.model.optimizer.iterations.numpy())
            except Exception:
                self._kt_base = 0

    def _kt_epoch_begin(self, epoch: int) -> None:
        self._kt_epoch = int(epoch)
        self._kt_batch = -1
        if self._kt_first_epoch is None:
            self._kt_first_epoch = self._kt_epoch
            if _last_step is None and self._kt_spe is not None:  # the process's first fit (maybe a resumed one)
                self._kt_base = self._kt_epoch * self._kt_spe
            self._kt_steps_before = self._kt_base
            # The first report's rate counts from here: the status shows an ETA from the first report on (one
            # status write per 30 s may be all a short job gets before its end).
            self._kt_last = (self._kt_base, time.monotonic())
        elif self._kt_spe is not None:
            self._kt_steps_before = self._kt_base + (self._kt_epoch - self._kt_first_epoch) * self._kt_spe

    def _kt_batch_end(self, batch: int, logs: Any) -> None:
        if not self._kt_batches:
            return
        self._kt_batch = batch
        now = time.monotonic()
        if now < self._kt_next:
            return
        self._kt_next = now + self._kt_interval
        self._kt_guard(
            "on_train_batch_end", self._kt_report, self._kt_epoch, self._kt_steps_before + batch + 1, logs, now
        )

    def _kt_epoch_end(self, epoch: int, logs: Any) -> None:
        if not self._kt_on:
            return
        done = self._kt_spe if self._kt_spe is not None else self._kt_batch + 1
        step = self._kt_steps_before + max(0, done)
        if self._kt_spe is None:
            self._kt_steps_before = step
        now = time.monotonic()
        self._kt_next = now + self._kt_interval
        self._kt_guard("on_epoch_end", self._kt_report, int(epoch) + 1, step, logs, now)

    def _kt_report(self, epoch: int, step: int, logs: Any, now: float) -> None:
        global _last_step
        _last_step = step
        metrics = {k: v for k, v in dict(logs or {}).items() if k not in _SKIP_LOGS}
        rates: dict[str, float] = {}
        if self._kt_last is not None and now > self._kt_last[1] and step >= self._kt_last[0]:
            rates["stepsPerSecond"] = round((step - self._kt_last[0]) / (now - self._kt_last[1]), 3)
        self._kt_last = (step, now)
        total = None
        if self._kt_epochs and self._kt_spe and self._kt_first_epoch is not None:
            total = self._kt_base + (self._kt_epochs - self._kt_first_epoch) * self._kt_spe
        self._kt_send(epoch=epoch, epochs=self._kt_epochs, step=step, steps=total, metrics=metrics, **rates)


_classes: dict[type, type] = {}


def callback_class(base: type) -> type:
    """A reporting-only Keras callback class on ``base`` (``tf.keras.callbacks.Callback``, Keras 3's ...)."""
    if base not in _classes:

        class KubetfProgressReport(ReportingMixin, base):
            """Reports Model.fit's progress to the kubetf operator (added by the trainer image)."""

            _kt_auto = True

            def __init__(self) -> None:
                super().__init__()
                self._supports_tf_logs = True
                self._kt_reset()

            def on_train_begin(self, logs: Any = None) -> None:
                self._kt_train_begin(True)

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self._kt_epoch_begin(epoch)

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                self._kt_batch_end(batch, logs)

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self._kt_epoch_end(epoch, logs)

        _classes[base] = KubetfProgressReport
    return _classes[base]
