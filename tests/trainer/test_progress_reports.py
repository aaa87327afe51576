"""Progress reports from real TensorFlow programs to a local stand-in for the operator's endpoint (protocol v1).

Each program runs as a subprocess with the trainer image's PYTHONPATH (so its sitecustomize loads), the operator's
variables (KUBETF_PROGRESS_URL, KUBETF_PROGRESS_TOKEN_FILE) and tiny models: a few seconds of training each. The
distributed programs' reports are asserted where those programs already run (TensorFlow once per scenario): the
library's callback and the sidecar evaluator in test_training.py, the guides' custom loops' prints in
test_migration.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import TOKEN, assert_clean, child_env, epoch_ends, progress_variables

from tests.progress_server import closed_port_url, progress_server


def run(
    args: list[str], tmp_path: Path, url: str, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    defaults = {
        **progress_variables(url, tmp_path),
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
        # (a task's process says when it started: its phase line, kubetf_trainer.phases)
        assert other.stdout.strip().splitlines()[-1] == "[] False None", other.stderr


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
