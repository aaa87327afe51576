"""Progress reports from real TensorFlow programs to a local stand-in for the operator's endpoint (protocol v1).

Each program runs as a subprocess with the trainer image's PYTHONPATH (so its sitecustomize loads), the operator's
variables (KUBETF_PROGRESS_URL, KUBETF_PROGRESS_TOKEN_FILE) and tiny models: a few seconds of training each.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, child_env, make_job

from kubetf.cli.jobctl import progress_line
from tests.progress_server import ProgressServer, closed_port_url, progress_server

EXAMPLES = REPO / "trainer_image" / "examples"
TOKEN = "projected-sa-token"


def run(
    args: list[str], tmp_path: Path, url: str, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    defaults = {
        "KUBETF_PROGRESS_URL": url,
        "KUBETF_PROGRESS_TOKEN_FILE": str(token),
        "KUBETF_PROGRESS_INTERVAL": "0.5",
        "KUBETF_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "KUBETF_JOB_NAME": "progress",
    }
    environ = child_env(**{**defaults, **env})
    for name in ("TF_CONFIG", "KUBETF_ROLE", "KUBETF_INDEX", "KUBETF_STRATEGY"):
        if name not in env:
            environ.pop(name, None)
    out = subprocess.run(
        [sys.executable, *args], env=environ, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )
    assert out.returncode == 0, f"exit {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    return out


def program(tmp_path: Path, *sources: str) -> str:
    path = tmp_path / "train.py"
    path.write_text("".join(textwrap.dedent(source) for source in sources))
    return str(path)


def epoch_ends(server: ProgressServer) -> list[tuple[int, int]]:
    """(epoch, step) of the reports at epoch ends, in order, once each (the exit-time report repeats the last)."""
    out: list[tuple[int, int]] = []
    for b in server.accepted:
        if b.get("steps") and b["step"] * b["epochs"] == b["epoch"] * b["steps"] and (b["epoch"], b["step"]) not in out:
            out.append((b["epoch"], b["step"]))
    return out


def at_epoch_end(server: ProgressServer, epoch: int) -> dict[str, Any]:
    return next(
        b
        for b in server.accepted
        if b.get("steps") and (b["epoch"], b["step"]) in epoch_ends(server) and b["epoch"] == epoch
    )


def assert_clean(server: ProgressServer) -> None:
    assert server.errors == [], server.errors  # every body passed the operator's parser
    assert {r["headers"].get("Authorization") for r in server.requests} == {f"Bearer {TOKEN}"}
    steps = [b["step"] for b in server.accepted if "step" in b]
    assert steps == sorted(steps), steps  # one run: the step never goes back
    assert server.accepted[-1]["final"] is True
    assert [b["final"] for b in server.accepted].count(True) == 1


def test_the_librarys_callback_reports_epochs_steps_and_the_evaluator_its_metrics(tmp_path):
    with progress_server(token=TOKEN) as server:
        out = run(
            [str(EXAMPLES / "mnist_mwms.py"), "--data", "synthetic", "--epochs", "3", "--steps-per-epoch", "15"],
            tmp_path,
            server.url,
            KUBETF_PROGRESS_INTERVAL="0.2",
        )
        assert_clean(server)
        assert epoch_ends(server) == [(1, 15), (2, 30), (3, 45)]
        assert all(b["epochs"] == 3 and b["steps"] == 45 for b in server.accepted)
        assert set(at_epoch_end(server, 3)["metrics"]) == {"loss", "accuracy"}
        assert server.accepted[-1]["step"] == 45
        assert server.status is not None
        assert (server.status["percent"], server.status["summary"], server.status["final"]) == (100.0, "100%", True)
        assert [p["epoch"] for p in server.status["history"] if p["step"] == 15 * p["epoch"]] == [1, 2, 3]
        # The JSON lines kubetf submit reads are unchanged
        kinds = [r["kubetf"] for r in map(progress_line, out.stdout.splitlines()) if r]
        assert kinds == ["start", "progress", "progress", "progress", "done"]
        # TensorBoard: the chief's epoch scalars in the checkpoint volume
        assert glob.glob(str(tmp_path / "ckpt" / "tensorboard" / "train" / "events.out.tfevents.*"))

    # The evaluator of the same job: each checkpoint's metrics, and nothing else
    with progress_server(token=TOKEN) as server:
        evaluator = json.dumps({"cluster": {"evaluator": ["localhost:1"]}, "task": {"type": "evaluator", "index": 0}})
        run(
            [str(EXAMPLES / "mnist_mwms.py"), "--data", "synthetic", "--epochs", "3", "--eval-steps", "2"],
            tmp_path,
            server.url,
            TF_CONFIG=evaluator,
            KUBETF_ROLE="evaluator",
            KUBETF_INDEX="0",
        )
        assert server.errors == []
        epochs = [b["epoch"] for b in server.accepted]  # evaluations within 0.5 s of each other are coalesced
        assert epochs[0] == 1 and epochs[-1] == 3 and epochs == sorted(epochs)
        assert all(set(b["metrics"]) == {"loss", "accuracy"} for b in with_results(server.accepted))
        assert all("step" not in b for b in server.accepted)
        assert glob.glob(str(tmp_path / "ckpt" / "tensorboard" / "eval" / "events.out.tfevents.*"))


def with_results(reports: list[dict]) -> list[dict]:
    """The reports that carry results: all but a final one that only repeats the position (the report at exit is
    sent alone when the last result went out more than 0.5 s before it; else the two are one)."""
    return [b for b in reports if "metrics" in b or not b["final"]]


GUIDE_FIT = """
    import json, sys, time
    import numpy as np
    import tensorflow as tf

    x = np.random.rand(1200, 8).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.monotonic()
    model.fit(x, y, batch_size=4, epochs=3, verbose=2, validation_data=(x[:100], y[:100]))
    print("fit took", time.monotonic() - start)
"""


def test_an_unchanged_fit_program_reports_through_sitecustomize(tmp_path):
    extra = """
    import gc
    from kubetf_trainer.callbacks import Progress

    class Count(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            gc.collect()
            print("reporters", sum(type(o).__name__ == "KubetfProgressReport" for o in gc.get_objects()))

    model.fit(x, y, batch_size=400, epochs=4, initial_epoch=3, verbose=0, callbacks=[Progress(), Count()])
    model.fit(x, y, batch_size=400, epochs=5, initial_epoch=4, verbose=0, callbacks=[Count()])
    """
    with progress_server(statuses=[503, 503], token=TOKEN) as server:
        out = run([program(tmp_path, GUIDE_FIT, extra)], tmp_path, server.url, KUBETF_PROGRESS_INTERVAL="0.2")
        assert_clean(server)
        assert [r["status"] for r in server.requests[:3]] == [503, 503, 204]  # not the leader: retried
        # fit #2 (3 steps per epoch, from epoch 3) goes on from fit #1's last step
        # An epoch end that comes less than a second after the last POST, or during the retries, waits and may be
        # overtaken by newer state: fit #1's epochs take about a second here.
        ends, expected = epoch_ends(server), [(1, 300), (2, 600), (3, 900), (4, 903)]
        assert ends == [e for e in expected if e in ends] and len(ends) >= 2 and ends[-1] == (4, 903)
        assert server.accepted[-1]["step"] == 903  # fit #3 reported nothing: the program's Progress took over
        assert any({"loss", "accuracy", "val_loss", "val_accuracy"} <= set(b["metrics"]) for b in server.accepted)
        within = [b for b in server.accepted if b["step"] < 900 and b["step"] % 300]
        assert within and all({"loss", "accuracy"} <= set(b["metrics"]) for b in within)  # inside the epochs
        # coalesced: about one POST per 0.2 s, plus the first, the epoch ends and the final one
        seconds = float(out.stdout.split("fit took ")[1].split()[0])
        assert len(server.requests) <= seconds / 0.2 + 4 + 4 + 3
        # the library's Progress in fit #2: no second reporter; fit #3: the image's again
        assert out.stdout.count("reporters 0") == 1 and out.stdout.count("reporters 1") == 1
        assert out.stdout.count("Epoch ") == 3 and "val_accuracy" in out.stdout  # Keras' own output as ever


def test_the_program_is_unaffected_when_the_operator_is_down(tmp_path):
    start = time.monotonic()
    out = run([program(tmp_path, GUIDE_FIT)], tmp_path, closed_port_url())
    elapsed = time.monotonic() - start
    fit = float(out.stdout.split("fit took ")[1].split()[0])
    assert out.stdout.count("Epoch ") == 3
    assert elapsed - fit < 60  # TensorFlow's import and the exit-time report (at most 3 s)
    assert out.stderr.count("kubetf progress: cannot deliver") == 1  # said once


def test_nothing_is_imported_or_wrapped_at_start_unless_reports_are_on(tmp_path):
    check = (
        "import os, sys; legacy = os.environ.get('TF_USE_LEGACY_KERAS'); "
        "from kubetf_trainer.autoreport import LineTee; "
        "print(sorted(m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules), "
        "isinstance(sys.stdout, LineTee), legacy)"
    )
    environ = child_env(KUBETF_PROGRESS_URL="http://127.0.0.1:9/v1/progress")
    for name in ("TF_CONFIG", "KUBETF_ROLE", "KUBETF_INDEX", "TF_USE_LEGACY_KERAS"):
        environ.pop(name, None)
    on = subprocess.run([sys.executable, "-c", check], env=environ, capture_output=True, text=True, timeout=60)
    assert on.stdout.strip() == "[] True None", on.stderr  # sitecustomize changed nothing in the environment
    off = subprocess.run(
        [sys.executable, "-c", check],
        env={k: v for k, v in environ.items() if k != "KUBETF_PROGRESS_URL"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert off.stdout.strip() == "[] False None", off.stderr
    for extra in ({"KUBETF_ROLE": "worker", "KUBETF_INDEX": "1"}, {"KUBETF_PROGRESS_AUTO": "0"}):
        other = subprocess.run(
            [sys.executable, "-c", check], env=dict(environ, **extra), capture_output=True, text=True, timeout=60
        )
        assert other.stdout.strip() == "[] False None", other.stderr


def test_the_mwms_custom_loops_prints_are_reported(tmp_path):
    with progress_server(token=TOKEN) as server:
        args = [str(EXAMPLES / "mwms_custom_loop.py"), "--epochs", "3", "--steps-per-epoch", "4"]
        out = run(args, tmp_path, server.url, KUBETF_PROGRESS_EPOCHS="3")
        assert out.stdout.count("Epoch: ") == 3
        assert_clean(server)
        epochs = [b["epoch"] for b in server.accepted]  # epochs less than 0.5 s apart are coalesced
        assert epochs[0] == 1 and epochs[-1] == 3 and epochs == sorted(epochs)
        assert all(b["epochs"] == 3 for b in server.accepted)
        assert all(set(b["metrics"]) == {"accuracy", "loss"} for b in with_results(server.accepted))
        assert server.status is not None and server.status["summary"] == "100%"

        # A second run resumes from the checkpoint and says so
        run(args, tmp_path, server.url, KUBETF_PROGRESS_EPOCHS="3")
        assert server.accepted[-1]["epoch"] == 3 and server.accepted[-1]["final"]


FAULT_TOLERANCE_LOOP = """
    # The fault tolerance migration guide's custom training loop, as the guide writes it.
    import tempfile
    import tensorflow as tf

    mnist = tf.keras.datasets.mnist
    x_train = tf.random.uniform((64, 28, 28))
    y_train = tf.random.uniform((64,), maxval=10, dtype=tf.int64)

    def create_model():
      return tf.keras.models.Sequential([
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(32, activation='relu'),
        tf.keras.layers.Dropout(0.2),
        tf.keras.layers.Dense(10)
      ])

    model = create_model()
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.001)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    log_dir = tempfile.mkdtemp()
    epochs = 3
    steps_per_epoch = 4

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    checkpoint_manager = tf.train.CheckpointManager(
                checkpoint, log_dir, max_to_keep=2)

    for epoch in range(epochs):
      if epoch > 0:
          tf.train.load_checkpoint(save_path)
      print(f"\\nStart of epoch {epoch}")

      for step in range(steps_per_epoch):
        with tf.GradientTape() as tape:

          logits = model(x_train, training=True)
          loss_value = loss_fn(y_train, logits)

          grads = tape.gradient(loss_value, model.trainable_weights)
          optimizer.apply_gradients(zip(grads, model.trainable_weights))

        save_path = checkpoint_manager.save()
        print(f"Checkpoint saved to {save_path}")
        print(f"Training loss at step {step}: {loss_value}")
"""


def test_the_fault_tolerance_guides_loop_is_reported(tmp_path):
    with progress_server(token=TOKEN) as server:
        out = run([program(tmp_path, FAULT_TOLERANCE_LOOP)], tmp_path, server.url, KUBETF_PROGRESS_EPOCHS="3")
        assert "Training loss at step 3:" in out.stdout
        assert_clean(server)
        last = server.accepted[-1]
        assert (last["epoch"], last["step"], last["epochs"], last["steps"]) == (2, 12, 3, 12)
        assert isinstance(last["metrics"]["loss"], float)
        assert server.status is not None and server.status["summary"] == "100%"


KERAS3_FIT = """
    import keras
    import numpy as np

    x = np.random.rand(800, 8).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int64")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
"""


def test_a_keras_3_fit_reports_too(tmp_path):
    with progress_server(token=TOKEN) as server:
        run([program(tmp_path, KERAS3_FIT)], tmp_path, server.url, TF_USE_LEGACY_KERAS="0")
        assert_clean(server)
        last = server.accepted[-1]
        assert (last["epoch"], last["epochs"], last["step"], last["steps"]) == (2, 2, 400, 400)
        assert server.status is not None and set(server.status["metrics"]) == {"loss", "accuracy"}


def _local_env(server: ProgressServer, tmp_path: Path, **extra: str) -> list[str]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {
        "KUBETF_PROGRESS_URL": server.url,
        "KUBETF_PROGRESS_TOKEN_FILE": str(token),
        "KUBETF_PROGRESS_INTERVAL": "0.5",
        **extra,
    }
    return [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]


@pytest.mark.timeout(300)
def test_parameter_server_training_reports_from_the_coordinator_only(local_run, tmp_path):
    """kubetf local gives every task the operator's own environment: the chief (ParameterServerStrategy's
    coordinator) reports its fit's epoch ends; the worker and the ps send nothing."""
    job = make_job(
        "psprogress",
        "ParameterServer",
        {"chief": 1, "worker": 1, "ps": 1},
        ["--data", "synthetic", "--epochs", "3", "--steps-per-epoch", "5"],
        example="ps_training.py",
    )
    with progress_server(token=TOKEN) as server:
        run = local_run(job, *_local_env(server, tmp_path))
        assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])
        assert_clean(server)
        assert epoch_ends(server)[-1] == (3, 15)
        # epoch ends only (batch-level logs are not known yet under ParameterServerStrategy)
        assert all(b["step"] % 5 == 0 and b["epochs"] == 3 for b in server.accepted)
        assert len(server.accepted) <= 4


@pytest.mark.timeout(300)
def test_the_ps_custom_loops_prints_are_reported(local_run, tmp_path):
    job = make_job(
        "psloop",
        "ParameterServer",
        {"chief": 1, "worker": 1, "ps": 1},
        ["--epochs", "3", "--steps-per-epoch", "3"],
        example="ps_custom_loop.py",
    )
    with progress_server(token=TOKEN) as server:
        run = local_run(job, *_local_env(server, tmp_path, KUBETF_PROGRESS_EPOCHS="3"))
        assert run.wait_exit(240) == 0, "\n".join(run.lines[-40:])
        assert any("chief-0 | Final loss is" in line for line in run.lines)
        assert_clean(server)
        epochs = [b["epoch"] for b in server.accepted]
        assert epochs[0] == 1 and epochs[-1] == 3 and epochs == sorted(epochs)
        assert server.status is not None and server.status["summary"] == "100%"
        assert set(server.status["metrics"]) == {"accuracy", "loss"}  # "Finished epoch ..." and "Final loss is ..."
