"""Keras callbacks: JSON progress lines, and BackupAndRestore that also saves on SIGTERM off GCP."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

from . import fence, phases, report
from .env import TaskInfo, clear_backup_scratch, task_info
from .keras_report import ReportingMixin
from .progress import emit
from .signals import SIGTERM_EXIT_CODE

log = logging.getLogger("kubetf_trainer")

PREEMPTION_EXIT_CODE = 42


class Progress(ReportingMixin, tf.keras.callbacks.Callback):
    """Prints the contract's JSON lines: ``start`` (with ``initial_epoch``), then one ``progress``
    per epoch. ``epoch`` in a progress line counts finished epochs (1-based, like Keras' "Epoch 2/5");
    ``initial_epoch`` is the number of epochs already done when this run began (K > 0 after a resume).

    On the task that coordinates training (``info.is_chief``) it also reports progress to the operator
    (``kubetf_trainer.report``, when ``KUBETF_PROGRESS_URL`` is set): each epoch end, and every few seconds
    within an epoch (see ``kubetf_trainer.keras_report``).

    Put it after ``BackupAndRestore`` in the callback list, so that a progress line for epoch N means
    the backup of epoch N is on disk.
    """

    def __init__(self, info: TaskInfo | None = None):
        super().__init__()
        self.info = info or task_info()
        self.started = False
        self.initial_epoch: int | None = None
        self.last_logs: dict[str, Any] = {}
        self._epoch_start = 0.0
        self._epoch = 0
        self._first_step_said = False
        # Batch logs stay tensors: read only when a report is due (and accepted under ParameterServerStrategy).
        self._supports_tf_logs = True
        self._kt_reset()

    def _steps(self) -> int:
        return int((self.params or {}).get("steps") or 0)

    def _epochs(self) -> int:
        return int((self.params or {}).get("epochs") or 0)

    def _start(self, initial_epoch: int) -> None:
        self.started = True
        self.initial_epoch = initial_epoch
        if initial_epoch == 0 and self.info.is_chief:  # a fresh run: forget an earlier run's evaluations
            fence.check()
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.info.checkpoints_dir, "evaluated.jsonl"))
        emit(
            "start",
            self.info,
            initial_epoch=initial_epoch,
            epochs=self._epochs(),
            steps_per_epoch=self._steps(),
            strategy=self.info.strategy,
            num_workers=self.info.num_workers,
        )

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._kt_train_begin(self.info.is_chief and not self.info.is_evaluator)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.started:
            self._start(epoch)
        self._epoch = epoch
        self._epoch_start = time.monotonic()
        self._kt_epoch_begin(epoch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._first_step_said:
            self._first_step_said = True
            self._first_step(self._epoch * self._steps() + batch + 1, logs)  # batch: its 0-based index
        self._kt_batch_end(batch, logs)

    def _first_step(self, step: int, logs: Any) -> None:
        """Say the run's first step done (``phases.FIRST_STEP``). Under ParameterServerStrategy ``fit`` only
        scheduled it on a worker: a thread waits for its result, so that training is not held meanwhile."""
        remote = [v for v in tf.nest.flatten(logs) if hasattr(v, "fetch")]
        if not remote:
            phases.mark(phases.FIRST_STEP, self.info, step=step)
            return

        def when_done() -> None:
            with contextlib.suppress(Exception):  # a step that failed says nothing
                for value in remote:
                    value.fetch()
                phases.mark(phases.FIRST_STEP, self.info, step=step)

        threading.Thread(target=when_done, name="kubetf-first-step", daemon=True).start()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        full = dict(logs or {})
        logs = dict(full)
        self.last_logs = logs
        seconds = time.monotonic() - self._epoch_start
        steps = self._steps()
        loss = logs.pop("loss", None)
        emit(
            "progress",
            self.info,
            epoch=epoch + 1,
            epochs=self._epochs(),
            step=(epoch + 1) * steps,
            loss=loss,
            metrics=logs,
            seconds=round(seconds, 4),
            steps_per_sec=round(steps / seconds, 3) if seconds > 0 and steps else None,
        )
        self._kt_epoch_end(epoch, full)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if not self.started:  # everything was already done before this run (resumed at the end)
            self._start(self._epochs())


class Hold(tf.keras.callbacks.Callback):
    """Holds the program at the end of epoch ``after_epoch`` (1-based, its backup and progress line written) until
    the file ``release`` exists, or SIGTERM ends it (exit 143: TensorFlow's own handler only notes the signal, and
    nothing would save or step while held). For tests that need a job at a known point: preempted there, not racing
    the end of training. A run resumed past that epoch never holds. Put it last in the callback list."""

    def __init__(self, after_epoch: int, release: str, info: TaskInfo | None = None):
        super().__init__()
        self.after_epoch, self.release, self.info = after_epoch, release, info or task_info()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch + 1 != self.after_epoch:
            return
        emit("held", self.info, epoch=self.after_epoch, release=self.release)
        before = signal.signal(signal.SIGTERM, _exit_held)
        try:
            while not os.path.exists(self.release):
                time.sleep(0.2)
        finally:
            if before is not None:  # (None: a handler set outside Python, which cannot be put back; SIGTERM then exits)
                signal.signal(signal.SIGTERM, before)
        emit("released", self.info, epoch=self.after_epoch)


class Fail(tf.keras.callbacks.Callback):
    """The program exits 1 at the end of epoch ``after_epoch`` (1-based, its backup written), once: ``marker`` (on
    the checkpoint volume, which outlives the program's pod and its restarts) says it did. For tests and the resume
    benchmark: a program's failure at a known point. Put it last in the callback list."""

    def __init__(self, after_epoch: int, marker: str, info: TaskInfo | None = None):
        super().__init__()
        self.after_epoch, self.marker, self.info = after_epoch, marker, info or task_info()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch + 1 != self.after_epoch or os.path.exists(self.marker):
            return
        with open(self.marker, "w") as out:
            out.write(f"{time.time()}\n")
        emit("failing", self.info, epoch=self.after_epoch, time=round(time.time(), 3))
        sys.stdout.flush()
        os._exit(1)  # as a crash: no teardown, the peers' collectives fail


def _exit_held(signum: int, frame: Any) -> None:
    sys.stdout.flush()
    fence.release()
    os._exit(SIGTERM_EXIT_CODE)


class TensorBoard(tf.keras.callbacks.TensorBoard):
    """``tf.keras.callbacks.TensorBoard`` where only the chief writes into the shared directory
    (``$KUBETF_CHECKPOINT_DIR/tensorboard`` unless ``log_dir`` is given): other workers write to a temporary
    directory they delete at the end, as the multi-worker tutorial does for models. Scalars per epoch
    (``update_freq="epoch"``), no profiling unless asked for."""

    def __init__(self, info: TaskInfo | None = None, log_dir: str | None = None, **kwargs: Any):
        self.info = info or task_info()
        self._scratch: str | None = None
        if not self.info.is_chief:
            self._scratch = tempfile.mkdtemp(prefix=f"kubetf-tensorboard-{self.info.role}{self.info.index}-")
            log_dir = self._scratch
        kwargs.setdefault("profile_batch", 0)
        super().__init__(log_dir=log_dir or self.info.tensorboard_dir, **kwargs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        # On disk now, not at the writers' next flush (2 minutes, or at teardown): a process that fails ends without
        # TensorFlow's teardown (kubetf_trainer.peers), and one killed has none.
        for writer in getattr(self, "_writers", {}).values():
            writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)


class ModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """``tf.keras.callbacks.ModelCheckpoint`` that writes only while this run holds the checkpoint directory
    (``kubetf_trainer.fence``)."""

    def _save_model(self, epoch: int, batch: Any, logs: dict[str, Any] | None) -> None:
        fence.check()
        super()._save_model(epoch, batch, logs)


class BackupAndRestore(tf.keras.callbacks.BackupAndRestore):
    """``tf.keras.callbacks.BackupAndRestore`` plus save-on-SIGTERM that works off GCP.

    tf-keras only enables ``save_before_preemption`` on GCP. This subclass wires
    ``tf.distribute.experimental.PreemptionCheckpointHandler`` into the same training state for
    MultiWorkerMirrored and Mirrored strategies: on SIGTERM every worker finishes the current step,
    saves the backup (model, epoch, step) and the process exits with code 42, which kubetf counts
    as a disruption. The next run resumes at the step after the saved one.

    It restores and saves only while this run of the job holds the checkpoint directory (``kubetf_trainer.fence``:
    it waits before restoring while another run holds it, and exits 42 before a save once another run took it).
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: str | int = "epoch",
        delete_checkpoint: bool = True,
        save_before_preemption: bool = True,
        info: TaskInfo | None = None,
        exit_code: int = PREEMPTION_EXIT_CODE,
        peer_timeout: float = 30.0,
    ):
        super().__init__(backup_dir, save_freq=save_freq, delete_checkpoint=delete_checkpoint)
        self.info = info or task_info()
        self.exit_code = exit_code
        self.peer_timeout = peer_timeout
        self._want_preemption = save_before_preemption
        self._handler: Any = None
        self._batch = -1

    def _preemption_supported(self) -> bool:
        strategy = self.model.distribute_strategy
        return isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy))

    def _implements_train_batch_hooks(self) -> bool:
        return bool(self._want_preemption) or super()._implements_train_batch_hooks()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        fence.claim()  # before restoring: what another run still writes is not read
        began = time.time()
        self._restore(logs)
        phases.mark(phases.RESTORED, self.info, seconds=round(time.time() - began, 3), step=self._restored_step())

    def _restored_step(self) -> int | None:
        """The global steps the restored backup holds (0: none; None: unknown)."""
        try:
            state = self._training_state
            epoch, batch = int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())
        except Exception:
            return None
        steps = int((self.params or {}).get("steps") or 0)
        if epoch < 0:
            return 0
        return epoch * steps + batch + 1 if batch >= 0 else (epoch + 1) * steps  # batch -1: saved at the epoch's end

    def _restore(self, logs: dict[str, Any] | None) -> None:
        strategy = self.model.distribute_strategy
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and not strategy.extended.should_checkpoint:
            # A scratch directory left by a killed run must not be restored from (see clear_backup_scratch).
            fence.check()
            clear_backup_scratch(self.backup_dir, strategy.extended._task_id)
        super().on_train_begin(logs)
        if not (self._want_preemption and self._preemption_supported()):
            return
        state = self._training_state
        if getattr(state, "_enable_save_before_preemption", False):  # tf-keras did it itself (GCP)
            self._handler = state.preemption_handler
            return
        strategy = self.model.distribute_strategy
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            getattr(strategy, "cluster_resolver", None),
            state.write_checkpoint_manager,
            termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=self._exit),
        )
        # Every worker restores from the chief's directory (the handler restored from the write
        # manager, which is a temp directory on non-chief workers): restore again, now that the
        # handler's step counter is part of the checkpoint, so all workers agree on the step count.
        handler._read_checkpoint_manager = state.read_checkpoint_manager
        state.read_checkpoint_manager.restore_or_initialize()
        handler._run_counter = int(handler._checkpointed_runs.numpy())
        state.preemption_handler = handler
        state._enable_save_before_preemption = True
        self.model._preemption_handler = handler
        self._handler = handler

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch = batch
        if self._preempting():
            fence.check()  # the preemption save comes in this step
        try:
            super().on_train_batch_end(batch, logs)
        except tf.errors.OpError as exc:
            if not self._preempting():
                raise
            # A peer went away in the middle of the preemption protocol: still a disruption, not a failure.
            self._report(saved=False, exit_code=SIGTERM_EXIT_CODE, error=str(exc).splitlines()[0][:200])
            report.flush(final=True)  # os._exit skips the exit-time report
            fence.release()
            os._exit(SIGTERM_EXIT_CODE)

    def _preempting(self) -> bool:
        """SIGTERM reached this worker or a peer: the preemption save runs in this step."""
        handler = self._handler
        return handler is not None and (
            handler._received_own_sigterm.is_set() or handler._received_checkpoint_step.is_set()
        )

    def _backup(self, epoch: int, batch: int = 0) -> None:
        fence.check()
        super()._backup(epoch, batch)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.delete_checkpoint:  # the backup is deleted: a write
            fence.check()
        super().on_train_end(logs)

    def _report(self, saved: bool, exit_code: int, **extra: Any) -> None:
        steps = int((self.params or {}).get("steps") or 0)
        emit(
            "preempted",
            self.info,
            epoch=self._current_epoch,  # epochs finished before the current one
            epoch_step=self._batch + 1,  # steps of the current epoch in the saved backup
            step=self._current_epoch * steps + self._batch + 1,
            saved=saved,
            backup_dir=self.backup_dir,
            exit_code=exit_code,
            **extra,
        )
        with contextlib.suppress(Exception):
            sys.stderr.flush()

    def _marker(self, step: int, role: str = "*", index: str = "*") -> str:
        return os.path.join(self.backup_dir, f"preempted-{step}-{role}-{index}")

    def _exit(self) -> None:
        """After the preemption save (same step on every worker)."""
        state = getattr(self, "_training_state", None)
        step = int(getattr(self._handler, "_run_counter", 0))
        if state is not None and state.write_checkpoint_manager is not state.read_checkpoint_manager:
            shutil.rmtree(state.write_checkpoint_manager.directory, ignore_errors=True)
            with open(self._marker(step, self.info.role, str(self.info.index)), "w") as f:
                f.write("saved\n")
        else:
            # The chief hosts the coordination service the others still talk to while they save: leave
            # only when every other worker has said it is done (or after peer_timeout seconds).
            peers = self.info.num_workers - 1
            deadline = time.monotonic() + self.peer_timeout
            while len(glob.glob(self._marker(step))) < peers and time.monotonic() < deadline:
                time.sleep(0.1)
            for path in glob.glob(self._marker(step)):
                with contextlib.suppress(OSError):
                    os.remove(path)
        self._report(saved=True, exit_code=self.exit_code)
        report.flush(final=True)  # os._exit skips the exit-time report
        fence.release()
        # os._exit: the checkpoint is on disk; skip TensorFlow's teardown, which can wait on peers.
        os._exit(self.exit_code)
