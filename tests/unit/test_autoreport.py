"""What the trainer image installs in unchanged programs (kubetf_trainer.autoreport), without TensorFlow."""

from __future__ import annotations

import io
import sys

import pytest

from kubetf_trainer import autoreport
from kubetf_trainer.keras_report import ReportingMixin


def feed(lines, env=None):
    sent = []
    guide = autoreport.GuideLines(env or {}, send=lambda **kw: sent.append(kw))
    for line in lines:
        guide.feed(line)
    return sent


def without_totals(sent):
    return [{k: v for k, v in s.items() if v is not None and k not in ("epochs", "steps")} for s in sent]


@pytest.mark.parametrize(
    "line,expected",
    [
        # Custom training loop with Keras and MultiWorkerMirroredStrategy (and this image's copy of it)
        (
            "Epoch: 0, accuracy: 0.812500, train_loss: 0.586453.",
            {"epoch": 1, "metrics": {"accuracy": 0.8125, "loss": 0.586453}},
        ),
        ("Resumed from /checkpoints/ckpt/ckpt-2 at epoch 2, step 40.", {"epoch": 2}),
        # Parameter server training with a custom training loop
        ("Finished epoch 3, accuracy is 0.568750.", {"epoch": 4, "metrics": {"accuracy": 0.56875}}),
        ("Final loss is 0.000123", {"metrics": {"loss": 0.000123}}),
        # Distributed training with Keras (evaluation after fit)
        ("Eval loss: 0.0412, Eval Accuracy: 0.9866", {"metrics": {"eval_loss": 0.0412, "eval_accuracy": 0.9866}}),
        # This image's TF1 example
        (
            '{"tf1": "progress", "task": "worker-0", "step": 300, "loss": 0.4, "accuracy": 0.9}',
            {"step": 300, "metrics": {"loss": 0.4, "accuracy": 0.9}},
        ),
        ('{"tf1": "resumed", "task": "worker-0", "step": 200}', {"step": 200}),
    ],
)
def test_the_guides_lines_become_reports(line, expected):
    assert without_totals(feed([line])) == [expected]


def test_non_finite_losses_are_reported():
    sent = feed(["Epoch: 4, accuracy: 0.100000, train_loss: nan.", "Final loss is inf"])
    assert str(sent[0]["metrics"]["loss"]) == "nan" and sent[1]["metrics"]["loss"] == float("inf")


@pytest.mark.parametrize(
    "line",
    [
        "Epoch 1/3",  # Keras' progress bar: fit is reported by its callback, not from its output
        "70/70 [==============================] - 3s 40ms/step - loss: 2.2 - accuracy: 0.3",
        "worker-0 | Epoch: 0, accuracy: 0.812500, train_loss: 0.586453.",  # kubetf local's prefixed lines
        "Epoch: 0, accuracy: 0.81",
        "Number of devices: 2",
        "Learning rate for epoch 1 is 0.0010000000474974513",
        '{"kubetf": "progress", "epoch": 1}',  # the library's own lines: its callback reports
        "Training loss at step 3: 2.3",  # a step index before any "Start of epoch" places nothing
        '{"tf1": "start", "task": "worker-0"}',
    ],
)
def test_other_lines_are_not_reports(line):
    assert feed([line]) == []


def test_the_fault_tolerance_guides_steps_become_global_steps():
    lines = ["", "Start of epoch 0"]
    for epoch in range(3):
        if epoch:
            lines += ["", f"Start of epoch {epoch}"]
        for step in range(5):
            lines += [f"Checkpoint saved to /tmp/x/ckpt-{epoch * 5 + step + 1}", f"Training loss at step {step}: 2.3"]
    sent = feed(lines, {"KUBETF_PROGRESS_EPOCHS": "3"})
    steps = [s.get("step") for s in sent]
    assert steps == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10, 11, 12, 13, 14, 15]
    assert [s["epoch"] for s in sent][:7] == [0, 0, 0, 0, 0, 0, 1]
    assert sent[0]["steps"] is None and sent[-1]["steps"] == 15 and sent[-1]["epochs"] == 3


def test_a_resumed_fault_tolerance_loop_reports_steps_once_it_knows_an_epochs_length():
    sent = feed(
        [
            "Start of epoch 2",
            "Training loss at step 0: 1.0",
            "Training loss at step 1: 0.9",
            "Start of epoch 3",
            "Training loss at step 0: 0.8",
        ]
    )
    assert [(s["epoch"], s.get("step")) for s in sent] == [(2, None), (2, None), (2, None), (3, 6), (3, 7)]


def test_totals_come_from_the_environment():
    sent = feed(
        ["Finished epoch 0, accuracy is 0.5.", '{"tf1": "progress", "task": "w", "step": 5}'],
        {"KUBETF_PROGRESS_EPOCHS": "4", "KUBETF_PROGRESS_STEPS": "100"},
    )
    assert [(s["epochs"], s["steps"]) for s in sent] == [(4, 100), (4, 100)]


def test_the_tee_passes_everything_through_and_sees_whole_lines():
    out = io.StringIO()
    seen = []
    tee = autoreport.LineTee(out, seen.append)
    print("Finished epoch 0, ", end="", file=tee)
    print("accuracy is 0.5.", file=tee)
    tee.write("a\r\nb\nc")
    tee.writelines(["d\n"])
    tee.flush()
    assert out.getvalue() == "Finished epoch 0, accuracy is 0.5.\na\r\nb\ncd\n"
    assert seen == ["Finished epoch 0, accuracy is 0.5.", "a", "b", "cd"]
    assert tee.getvalue() == out.getvalue()  # anything else is the stream's own


def test_the_tee_survives_a_failing_reader():
    out = io.StringIO()

    def broken(line):
        raise RuntimeError("boom")

    tee = autoreport.LineTee(out, broken)
    assert tee.write("x\n") == 2
    assert out.getvalue() == "x\n"


class _Reporter:
    kubetf_progress_reporter = True


@pytest.mark.parametrize(
    "args,kwargs,added",
    [
        ((), {}, True),
        (("x",), {"epochs": 3}, True),
        (("x",), {"callbacks": None}, True),
        (("x",), {"callbacks": ["cb"]}, True),
        (("x", None, None, 3, 0, ["cb"]), {}, True),  # callbacks given by position
        (("x",), {"callbacks": ("cb",)}, True),
        (("x",), {"callbacks": ["cb", _Reporter()]}, False),  # the library's Progress is there
        (("x",), {"callbacks": object()}, False),  # a CallbackList: left alone
    ],
)
def test_fit_gets_one_reporting_callback(args, kwargs, added):
    marker = object()
    new_args, new_kwargs = autoreport.with_reporter(args, dict(kwargs), lambda: marker)
    callbacks = new_args[5] if len(args) > 5 else new_kwargs.get("callbacks")
    if added:
        assert list(callbacks)[-1] is marker and len(new_args) == len(args)
        assert list(callbacks)[:-1] == list((args[5] if len(args) > 5 else kwargs.get("callbacks")) or [])
    else:
        assert (new_args, new_kwargs) == (args, kwargs)


def test_the_import_hook_wraps_fit_when_the_module_is_imported(tmp_path, monkeypatch):
    package = tmp_path / "fakekeras"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "training.py").write_text(
        "class Model:\n"
        "    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose='auto', callbacks=None):\n"
        "        '''Trains.'''\n"
        "        return callbacks\n"
    )
    (package / "callbacks.py").write_text("class Callback:\n    def __init__(self):\n        self.params = {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(autoreport.FIT_TARGETS, "fakekeras.training", ("Model", "fakekeras.callbacks", "Callback"))
    before = list(sys.meta_path)
    try:
        autoreport.install_fit_hook()
        import fakekeras.training as training

        assert training.Model.fit.__doc__ == "Trains."
        callbacks = training.Model().fit("x", callbacks=["mine"])
        assert callbacks[0] == "mine" and isinstance(callbacks[1], ReportingMixin) and len(callbacks) == 2
        assert type(callbacks[1]).__mro__[2].__module__ == "fakekeras.callbacks"
        assert training.Model().fit("x", callbacks=callbacks) == callbacks  # never a second one
        assert "def fit" in training.__loader__.get_source("fakekeras.training")  # tracebacks still read sources
    finally:
        sys.meta_path[:] = before
        for name in ("fakekeras", "fakekeras.training", "fakekeras.callbacks"):
            sys.modules.pop(name, None)


def test_a_broken_keras_module_is_left_alone(tmp_path, monkeypatch):
    (tmp_path / "oddkeras.py").write_text("Model = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(autoreport.FIT_TARGETS, "oddkeras", ("Model", "oddkeras", "Callback"))
    before = list(sys.meta_path)
    try:
        autoreport.install_fit_hook()
        import oddkeras

        assert oddkeras.Model is None
    finally:
        sys.meta_path[:] = before
        sys.modules.pop("oddkeras", None)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {
            "KUBETF_PROGRESS_URL": "http://x/v1/progress",
            "KUBETF_ROLE": "worker",
            "KUBETF_INDEX": "1",
            "TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}',
        },
        {"KUBETF_PROGRESS_URL": "http://x/v1/progress", "KUBETF_ROLE": "evaluator"},
        {"KUBETF_PROGRESS_URL": "http://x/v1/progress", "KUBETF_PROGRESS_AUTO": "0"},
    ],
)
def test_nothing_is_installed_where_nothing_is_reported(env, monkeypatch):
    stdout, meta_path = sys.stdout, list(sys.meta_path)
    assert autoreport.install(env) is False
    assert sys.stdout is stdout and sys.meta_path == meta_path


class _Base:
    def __init__(self):
        self.params = {}
        self.model = None


def fake_fit(callback, epochs, steps, initial_epoch=0, batch_seconds=0.0, clock=None):
    """Drive the hooks as Keras' fit does."""
    callback.params = {"epochs": epochs, "steps": steps}
    callback.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        callback.on_epoch_begin(epoch)
        for batch in range(steps or 7):
            if clock is not None:
                clock[0] += batch_seconds
            callback.on_train_batch_end(batch, {"loss": 1.0, "accuracy": 0.5})
        callback.on_epoch_end(epoch, {"loss": 0.9, "accuracy": 0.6, "val_loss": 1.1})


@pytest.fixture
def keras_reports(monkeypatch):
    from kubetf_trainer import keras_report
    from kubetf_trainer import report as rp

    sent = []
    clock = [1000.0]
    monkeypatch.setattr(rp, "enabled", lambda: True)
    monkeypatch.setattr(rp, "task_kind", lambda environ=None: "training")
    monkeypatch.setattr(rp, "interval", lambda: 5.0)
    monkeypatch.setattr(rp, "auto_report", lambda **kw: sent.append(kw))
    monkeypatch.setattr(keras_report.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(keras_report, "_last_step", None)
    return keras_report.callback_class(_Base)(), sent, clock


def test_the_keras_callback_reports_epoch_ends_and_every_interval_within(keras_reports):
    callback, sent, clock = keras_reports
    fake_fit(callback, epochs=2, steps=10, batch_seconds=1.0, clock=clock)
    assert [(s["epoch"], s["step"]) for s in sent] == [(0, 5), (0, 10), (1, 10), (1, 15), (1, 20), (2, 20)]
    assert all(s["epochs"] == 2 and s["steps"] == 20 for s in sent)
    assert sent[2]["metrics"] == {"loss": 0.9, "accuracy": 0.6, "val_loss": 1.1}
    assert sent[0]["stepsPerSecond"] == sent[1]["stepsPerSecond"] == 1.0  # the first too: from the fit's start


def test_a_resumed_fit_and_a_later_fit_count_on(keras_reports):
    callback, sent, _ = keras_reports
    fake_fit(callback, epochs=4, steps=10, initial_epoch=2)  # BackupAndRestore resumed at epoch 2
    assert [(s["epoch"], s["step"], s["steps"]) for s in sent] == [(3, 30, 40), (4, 40, 40)]
    sent.clear()
    fake_fit(callback, epochs=2, steps=3)  # fine-tuning: a second fit, 3 steps per epoch
    assert [(s["epoch"], s["step"], s["steps"]) for s in sent] == [(1, 43, 46), (2, 46, 46)]


def test_without_steps_per_epoch_the_batches_are_counted(keras_reports):
    callback, sent, _ = keras_reports
    fake_fit(callback, epochs=2, steps=None)
    assert [(s["epoch"], s["step"], s["steps"]) for s in sent] == [(1, 7, None), (2, 14, None)]


def test_a_failing_report_turns_the_callback_off(keras_reports, monkeypatch):
    from kubetf_trainer import report as rp

    callback, _, _ = keras_reports

    def broken(**kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(rp, "auto_report", broken)
    fake_fit(callback, epochs=2, steps=3)  # no exception into fit
    assert not callback._kt_on
