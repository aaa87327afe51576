"""Progress reports from unchanged programs: what the trainer image's ``sitecustomize`` installs.

Only when ``KUBETF_PROGRESS_URL`` is set, and only on the task that coordinates training (the chief, else worker 0;
the evaluator and the other tasks get nothing installed):

1. Keras ``Model.fit`` (tf-keras, the image's ``tf.keras``; and Keras 3): an import hook wraps ``fit`` once Keras'
   model module is imported (TensorFlow is never imported by this module), and each ``fit`` gets a reporting
   callback at the end of its callbacks, unless one is there already (the library's ``Progress``).
2. The guides' custom training loops: ``sys.stdout`` is wrapped by a tee that passes everything through unchanged
   and recognises the guides' own lines (`GuideLines`).

Nothing here may break the program: every hook catches its own errors, and then the program runs as without it.
A program that calls ``kubetf_trainer.report.report`` itself takes over (the automatic reports stop).
``KUBETF_PROGRESS_AUTO=0`` turns all of this off.

Standard library only.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import json
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from . import imports
from . import report as _report

ENV_AUTO = "KUBETF_PROGRESS_AUTO"
ENV_EPOCHS = "KUBETF_PROGRESS_EPOCHS"
ENV_STEPS = "KUBETF_PROGRESS_STEPS"

# module defining Model -> (its Model class, the module and name of that Keras' Callback base)
FIT_TARGETS = {
    "tf_keras.src.engine.training": ("Model", "tf_keras.src.callbacks", "Callback"),
    "keras.src.models.model": ("Model", "keras.src.callbacks.callback", "Callback"),
}
_CALLBACKS_ARG = 5  # fit(self, x, y, batch_size, epochs, verbose, callbacks, ...): the same in tf-keras and Keras 3

_installed = False


def _note(kind: str, message: str, *args: Any) -> None:
    r = _report.reporter()
    if r is not None:
        r._log_once(kind, message, *args)


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Install the fit hook and the stdout tee when this task reports training progress. Returns whether it did."""
    global _installed
    env = os.environ if environ is None else environ
    if _installed or not env.get(_report.ENV_URL) or env.get(ENV_AUTO, "1").strip().lower() in ("0", "false", "no"):
        return False
    if _report.task_kind(env) != "training":
        return False
    _installed = True
    install_fit_hook()
    if sys.stdout is not None:
        sys.stdout = LineTee(sys.stdout, GuideLines(env).feed)
    return True


# -- Model.fit ---------------------------------------------------------------------------------------------------


def install_fit_hook() -> None:
    for name in FIT_TARGETS:  # already imported (not at interpreter start, but when called later)
        module = sys.modules.get(name)
        if module is not None:
            patch_fit(module, name)
    if not any(isinstance(f, _FitFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FitFinder())


class _FitFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for Keras' model modules it asks the other finders and wraps the loader, so the module
    is patched right after it ran."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in FIT_TARGETS or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            return imports.find_wrapped(self, fullname, path, target, functools.partial(_then_patch, fullname))
        except Exception:
            return None
        finally:
            self._busy.discard(fullname)


def _then_patch(name: str, module: Any, run: Callable[[], None]) -> None:
    run()
    patch_fit(module, name)


def patch_fit(module: Any, name: str) -> bool:
    """Wrap ``module.Model.fit`` so that each fit gets a reporting callback. Never raises."""
    try:
        model_attr, callbacks_module, callback_attr = FIT_TARGETS[name]
        model = getattr(module, model_attr)
        original = model.fit
        if getattr(original, "_kubetf_progress", False):
            return True

        @functools.wraps(original)
        def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                args, kwargs = with_reporter(args, kwargs, lambda: _callback(callbacks_module, callback_attr))
            except Exception as exc:
                _note(
                    "fit-hook",
                    "kubetf progress: could not add the reporting callback (%s: %s)",
                    type(exc).__name__,
                    exc,
                )
            return original(self, *args, **kwargs)

        fit._kubetf_progress = True  # type: ignore[attr-defined]
        model.fit = fit
        return True
    except Exception:
        return False


def _callback(module_name: str, attr: str) -> Any:
    from .keras_report import callback_class

    base = getattr(importlib.import_module(module_name), attr)
    return callback_class(base)()


def with_reporter(
    args: tuple[Any, ...], kwargs: dict[str, Any], make: Callable[[], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """fit's arguments with a reporting callback appended to ``callbacks`` (positional or keyword), unless one
    reports already or the callbacks are not a list (a ``CallbackList`` is left alone)."""
    callbacks = args[_CALLBACKS_ARG] if len(args) > _CALLBACKS_ARG else kwargs.get("callbacks")
    if callbacks is None:
        callbacks = []
    elif not isinstance(callbacks, (list, tuple)):
        return args, kwargs
    if any(getattr(cb, "kubetf_progress_reporter", False) for cb in callbacks):
        return args, kwargs
    new = [*callbacks, make()]
    if len(args) > _CALLBACKS_ARG:
        return (*args[:_CALLBACKS_ARG], new, *args[_CALLBACKS_ARG + 1 :]), kwargs
    return args, {**kwargs, "callbacks": new}


# -- printed lines -----------------------------------------------------------------------------------------------


class LineTee:
    """``sys.stdout`` as it was, plus each complete line handed to ``on_line`` (errors there are swallowed)."""

    MAX_LINE = 4096

    def __init__(self, stream: Any, on_line: Callable[[str], None]):
        self._kubetf_stream = stream
        self._kubetf_on_line = on_line
        self._kubetf_buffer = ""
        self._kubetf_lock = threading.Lock()

    def write(self, text: str) -> int:
        n = self._kubetf_stream.write(text)
        try:
            if isinstance(text, str):
                self._kubetf_feed(text)
        except Exception:
            pass
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _kubetf_feed(self, text: str) -> None:
        lines: list[str] = []
        with self._kubetf_lock:
            if "\n" not in text:
                if len(self._kubetf_buffer) < self.MAX_LINE:
                    self._kubetf_buffer += text
                return
            head, *rest = text.split("\n")
            lines.append(self._kubetf_buffer + head)
            lines.extend(rest[:-1])
            self._kubetf_buffer = rest[-1][: self.MAX_LINE]
        for line in lines:
            if len(line) <= self.MAX_LINE:
                self._kubetf_on_line(line.rstrip("\r"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kubetf_stream, name)

    def __iter__(self) -> Any:
        return iter(self._kubetf_stream)


_NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|infinity)"


class GuideLines:
    """What the TensorFlow guides' custom training loops print, as reports. Each pattern matches a whole line, as
    the guide prints it (Python's ``%f``/``{}`` formatting, ``nan``/``inf`` included):

    - Custom training loop with Keras and MultiWorkerMirroredStrategy:
      ``Epoch: 0, accuracy: 0.812500, train_loss: 0.586453.`` -> epoch 1, metrics accuracy and loss;
      ``Resumed from PATH at epoch 2, step 40.`` (this image's example) -> epoch 2.
    - Parameter server training, custom training loop: ``Finished epoch 0, accuracy is 0.568750.`` -> epoch 1,
      metric accuracy; ``Final loss is 0.000000`` -> metric loss.
    - Migrating fault tolerance (custom loop): ``Start of epoch 2`` -> epoch 2;
      ``Training loss at step 3: 2.34`` -> metric loss, and the global step once the steps per epoch are known
      (after the first full epoch this run saw, or at once in epoch 0).
    - Distributed training with Keras: ``Eval loss: 0.04, Eval accuracy: 0.98`` -> metrics eval_loss,
      eval_accuracy.
    - This image's TF1 example (``tf1_between_graph.py``): its JSON lines ``{"tf1": "progress", "step": ...}``.

    Totals are not printed by the guides: ``KUBETF_PROGRESS_EPOCHS`` / ``KUBETF_PROGRESS_STEPS`` give them.
    """

    MWMS_EPOCH = re.compile(rf"Epoch: (\d+), accuracy: ({_NUM}), train_loss: ({_NUM})\.", re.I)
    MWMS_RESUMED = re.compile(r"Resumed from .+ at epoch (\d+), step (\d+)\.")
    PS_EPOCH = re.compile(rf"Finished epoch (\d+), accuracy is ({_NUM})\.", re.I)
    PS_FINAL = re.compile(rf"Final loss is ({_NUM})", re.I)
    FT_EPOCH = re.compile(r"Start of epoch (\d+)")
    FT_STEP = re.compile(rf"Training loss at step (\d+): ({_NUM})", re.I)
    EVAL = re.compile(rf"Eval loss: ({_NUM}), Eval accuracy: ({_NUM})", re.I)

    def __init__(self, environ: Mapping[str, str] | None = None, send: Callable[..., None] | None = None):
        env = os.environ if environ is None else environ
        self.epochs = _positive(env.get(ENV_EPOCHS))
        self.steps = _positive(env.get(ENV_STEPS))
        self.send = send or _report.auto_report
        self.epoch: int | None = None  # fault tolerance guide: the epoch being run (0-based)
        self.last_step: int | None = None  # ... and its last step index in that epoch
        self.steps_per_epoch: int | None = None

    def feed(self, line: str) -> None:
        line = line.strip()
        if not line or len(line) > 1024:
            return
        m = self.MWMS_EPOCH.fullmatch(line)
        if m:
            self._send(epoch=int(m[1]) + 1, metrics={"accuracy": float(m[2]), "loss": float(m[3])})
            return
        m = self.MWMS_RESUMED.fullmatch(line)
        if m:
            self._send(epoch=int(m[1]))
            return
        m = self.PS_EPOCH.fullmatch(line)
        if m:
            self._send(epoch=int(m[1]) + 1, metrics={"accuracy": float(m[2])})
            return
        m = self.PS_FINAL.fullmatch(line)
        if m:
            self._send(metrics={"loss": float(m[1])})
            return
        m = self.FT_EPOCH.fullmatch(line)
        if m:
            self._start_epoch(int(m[1]))
            return
        m = self.FT_STEP.fullmatch(line)
        if m:
            self._train_step(int(m[1]), float(m[2]))
            return
        m = self.EVAL.fullmatch(line)
        if m:
            self._send(metrics={"eval_loss": float(m[1]), "eval_accuracy": float(m[2])})
            return
        if line.startswith('{"tf1": '):
            self._tf1(line)

    def _send(self, **fields: Any) -> None:
        steps = self.steps
        if steps is None and self.epochs and self.steps_per_epoch:
            steps = self.epochs * self.steps_per_epoch
        self.send(epochs=self.epochs, steps=steps, **fields)

    def _global_step(self, epoch: int, done_in_epoch: int) -> int | None:
        if self.steps_per_epoch is not None:
            return epoch * self.steps_per_epoch + done_in_epoch
        return done_in_epoch if epoch == 0 else None

    def _start_epoch(self, epoch: int) -> None:
        if self.epoch is not None and epoch == self.epoch + 1 and self.last_step is not None:
            self.steps_per_epoch = self.last_step + 1
        self.epoch, self.last_step = epoch, None
        step = self._global_step(epoch, 0)
        self._send(epoch=epoch, **({"step": step} if step is not None else {}))

    def _train_step(self, index: int, loss: float) -> None:
        if self.epoch is None:  # no epoch seen: the step index alone places nothing
            return
        self.last_step = index
        step = self._global_step(self.epoch, index + 1)
        self._send(epoch=self.epoch, metrics={"loss": loss}, **({"step": step} if step is not None else {}))

    def _tf1(self, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict) or record.get("tf1") not in ("progress", "session", "resumed", "done"):
            return
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        metrics = {k: v for k in ("loss", "accuracy") if isinstance(v := record.get(k), (int, float))}
        self._send(step=step, **({"metrics": metrics} if metrics else {}))


def _positive(value: str | None) -> int | None:
    try:
        number = float(value or "")
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number >= 1 else None
