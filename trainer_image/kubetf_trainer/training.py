"""The pieces around ``model.fit``: standard callbacks, final model save, done marker, evaluator loop."""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

from . import fence, report
from .callbacks import BackupAndRestore, Fail, Hold, ModelCheckpoint, Progress, TensorBoard
from .env import TaskInfo, task_info
from .progress import emit

log = logging.getLogger("kubetf_trainer")

CKPT_PATTERN = "ckpt-{epoch:04d}"
_CKPT_RE = re.compile(r"ckpt-(\d+)\.index$")


def tensorboard_available() -> bool:
    """Whether ``tf.summary`` can write: TensorFlow 2.21 no longer installs TensorBoard (the image does)."""
    if importlib.util.find_spec("tensorboard") is not None:
        return True
    log.warning("kubetf_trainer: no TensorBoard logs: the tensorboard package is not installed")
    return False


def standard_callbacks(
    info: TaskInfo | None = None,
    *,
    backup: bool = True,
    backup_freq: str | int = "epoch",
    save_before_preemption: bool = True,
    epoch_checkpoints: bool = True,
    tensorboard: bool = True,
    progress: bool = True,
    hold_after_epoch: int | None = None,
    fail_after_epoch: str | None = None,
) -> list[Any]:
    """The callbacks every kubetf example uses, in the order that matters:

    1. ``BackupAndRestore`` on ``$KUBETF_CHECKPOINT_DIR/backup`` (resume after a restart; on SIGTERM,
       MWMS/Mirrored save and exit 42),
    2. ``ModelCheckpoint`` of the weights per epoch to ``$KUBETF_CHECKPOINT_DIR/checkpoints/ckpt-NNNN``
       (what the evaluator reads),
    3. ``TensorBoard``: scalars per epoch in ``$KUBETF_CHECKPOINT_DIR/tensorboard`` (the chief; other
       workers write to a temporary directory),
    4. ``Progress``: JSON lines, printed after the epoch's backup is written, and progress reports to the
       operator,
    5. ``Hold`` (``hold_after_epoch``, for tests): the program waits after that epoch until the file
       ``$KUBETF_CHECKPOINT_DIR/release`` exists or SIGTERM ends it;
       ``Fail`` (``fail_after_epoch``, ``ROLE-INDEX:EPOCH``, for tests and ``make bench-resume``): that task's
       program exits 1 after that epoch's backup, once.
    """
    info = info or task_info()
    out: list[Any] = []
    if backup:
        out.append(
            BackupAndRestore(
                info.backup_dir,
                save_freq=backup_freq,
                save_before_preemption=save_before_preemption,
                info=info,
            )
        )
    if epoch_checkpoints:
        out.append(ModelCheckpoint(os.path.join(info.checkpoints_dir, CKPT_PATTERN), save_weights_only=True))
    if tensorboard and tensorboard_available():
        out.append(TensorBoard(info))
    if progress:
        out.append(Progress(info))
    if hold_after_epoch is not None:
        out.append(Hold(hold_after_epoch, os.path.join(info.checkpoint_dir, "release"), info))
    if fail_after_epoch is not None:
        task, _, epoch = fail_after_epoch.rpartition(":")
        if task == f"{info.role}-{info.index}":
            out.append(Fail(int(epoch), os.path.join(info.checkpoint_dir, f"failed-{task}"), info))
    return out


def prepare(info: TaskInfo | None = None) -> TaskInfo:
    """Wait while another run of the job holds the checkpoint directory (``kubetf_trainer.fence``; exits 0 when that
    run finished the training meanwhile), then create the checkpoint directories (the chief also clears a stale
    ``done`` marker)."""
    info = info or task_info()
    fence.claim()
    fence.check()
    os.makedirs(info.checkpoints_dir, exist_ok=True)
    if info.is_chief and os.path.exists(info.done_marker):
        os.remove(info.done_marker)
    return info


def _write_path(path: str, info: TaskInfo) -> str:
    """The tutorial's ``write_filepath``: non-chief workers write to a temporary path."""
    if info.is_chief:
        return path
    base = tempfile.mkdtemp(prefix=f"kubetf-{info.role}{info.index}-")
    return os.path.join(base, os.path.basename(path))


def save_model(model: Any, info: TaskInfo | None = None, path: str | None = None) -> str:
    """Save the final model. Under MWMS every worker must call this (saving is collective): the
    chief writes to ``path`` (default ``$KUBETF_CHECKPOINT_DIR/model``), the others to a temporary
    path that is deleted afterwards. Returns where the chief's model is."""
    info = info or task_info()
    target = path or info.model_dir
    write_path = _write_path(target, info)
    if info.is_chief and os.path.isdir(write_path):
        shutil.rmtree(write_path)
    model.save(write_path)
    if not info.is_chief:
        shutil.rmtree(os.path.dirname(write_path), ignore_errors=True)
    return target


def checkpoint_epochs(directory: str) -> list[int]:
    """Epoch numbers of the ``ckpt-NNNN`` weights in ``directory``, sorted."""
    epochs = []
    for path in glob.glob(os.path.join(directory, "ckpt-*.index")):
        m = _CKPT_RE.search(os.path.basename(path))
        if m:
            epochs.append(int(m.group(1)))
    return sorted(epochs)


def finish(
    model: Any,
    info: TaskInfo | None = None,
    *,
    epochs: int,
    history: Any = None,
    save: bool = True,
) -> str | None:
    """After ``fit``: save the model (all MWMS workers call this), and on the chief write the
    ``done`` marker the evaluator waits for and print the ``done`` line."""
    info = info or task_info()
    fence.check()
    model_path = save_model(model, info) if save else None
    if info.is_chief:
        done = {
            "epochs": epochs,
            "last_checkpoint": os.path.basename(CKPT_PATTERN.format(epoch=epochs)),
            "model_path": model_path,
            "time": time.time(),
        }
        os.makedirs(info.checkpoints_dir, exist_ok=True)
        tmp = info.done_marker + ".tmp"
        with open(tmp, "w") as f:
            json.dump(done, f)
        os.replace(tmp, info.done_marker)
        losses = (getattr(history, "history", None) or {}).get("loss") or [None]
        emit("done", info, epochs=epochs, model_path=model_path, loss=losses[-1])
    fence.release(done=True)  # a run of the job waiting for the directory has nothing left to do
    return model_path


def _read_done(info: TaskInfo) -> dict[str, Any] | None:
    try:
        with open(info.done_marker) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except ValueError:
        return None


def evaluate_checkpoints(
    model: Any,
    data: Any,
    info: TaskInfo | None = None,
    *,
    steps: int | None = None,
    poll_seconds: float = 1.0,
    idle_timeout: float | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    tensorboard: bool = True,
) -> list[dict[str, Any]]:
    """The evaluator: evaluate every new ``ckpt-NNNN`` in ``$KUBETF_CHECKPOINT_DIR/checkpoints`` in
    order, print one ``eval`` line each, and return after the last one (once the chief's ``done``
    marker names it). ``data`` is a dataset (or ``(x, y)`` tuple) for ``model.evaluate``.
    ``idle_timeout``: give up after that many seconds without a new checkpoint.
    Evaluated checkpoints are recorded in ``checkpoints/evaluated.jsonl``, so a restarted evaluator
    does not evaluate them again. Each result is also reported to the operator (``evalMetrics`` in the
    job's ``status.progress``) and, with ``tensorboard``, written as ``epoch_<metric>`` scalars at step
    = epoch to ``$KUBETF_CHECKPOINT_DIR/tensorboard/eval``."""
    info = info or task_info()
    fence.claim()
    directory = info.checkpoints_dir
    os.makedirs(directory, exist_ok=True)
    record_path = os.path.join(directory, "evaluated.jsonl")
    seen: set[int] = set()
    if os.path.exists(record_path):
        with open(record_path) as f:
            for line in f:
                try:
                    seen.add(int(json.loads(line)["epoch"]))
                except (ValueError, KeyError, TypeError):
                    continue
    results: list[dict[str, Any]] = []
    writer = None
    if tensorboard and tensorboard_available():
        writer = tf.summary.create_file_writer(os.path.join(info.tensorboard_dir, "eval"))
    last_new = time.monotonic()
    while True:
        done = _read_done(info)
        pending = [e for e in checkpoint_epochs(directory) if e not in seen]
        for epoch in pending:
            prefix = os.path.join(directory, CKPT_PATTERN.format(epoch=epoch))
            status = model.load_weights(prefix)
            if status is not None and hasattr(status, "expect_partial"):
                status.expect_partial()
            if isinstance(data, tuple):
                res = model.evaluate(data[0], data[1], verbose=0, return_dict=True, steps=steps)
            else:
                res = model.evaluate(data, verbose=0, return_dict=True, steps=steps)
            res = {k: float(v) for k, v in res.items()}
            loss = res.pop("loss", None)
            record = emit("eval", info, checkpoint=os.path.basename(prefix), epoch=epoch, loss=loss, metrics=res)
            fence.check()
            with open(record_path, "a") as f:
                f.write(json.dumps({"epoch": epoch, "loss": loss, "metrics": res}) + "\n")
            scalars = {"loss": loss, **res} if loss is not None else dict(res)
            report.report(epoch=epoch, metrics=scalars)
            if writer is not None:
                with writer.as_default():
                    for name, value in scalars.items():
                        tf.summary.scalar(f"epoch_{name}", value, step=epoch)
                writer.flush()
            seen.add(epoch)
            results.append(record)
            if on_result:
                on_result(record)
            last_new = time.monotonic()
        if pending:
            continue
        if done is not None:
            last = int(done.get("epochs") or 0)
            if not last or last in seen or last not in checkpoint_epochs(directory):
                return results
        if idle_timeout is not None and time.monotonic() - last_new > idle_timeout:
            log.warning("kubetf_trainer: no new checkpoint for %.0fs, evaluator stops", idle_timeout)
            return results
        time.sleep(poll_seconds)
