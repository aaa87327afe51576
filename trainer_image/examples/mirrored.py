"""Distributed training with Keras (TensorFlow tutorial): MirroredStrategy on one machine, run as a
kubetf TrainingJob (strategy: Mirrored, one pod with all its GPUs).

Without GPUs, ``--cpu-replicas N`` splits the CPU into N logical devices so the strategy still
mirrors. BackupAndRestore resumes after a restart; SIGTERM saves the backup and exits 42.
Only the data loading differs from the tutorial (see --data).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kubetf_trainer

import kubetf_trainer as kt
from kubetf_trainer import args as kargs


def build_model(tf):
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(),
        metrics=["accuracy"],
    )
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kargs.add_arguments(parser, epochs=3, steps_per_epoch=50, batch_size=64)
    parser.add_argument("--cpu-replicas", type=int, default=1, help="logical CPU devices when there is no GPU")
    args = parser.parse_args(argv)
    info = kargs.task(args)
    (x_train, y_train), (x_test, y_test) = kargs.load_data(args, info)
    x_train, x_test = x_train[..., None], x_test[..., None]

    import tensorflow as tf

    if info.is_evaluator:
        model = build_model(tf)
        test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)
        kt.evaluate_checkpoints(model, test, info, steps=args.eval_steps, idle_timeout=args.eval_idle_timeout)
        return 0

    strategy = kt.make_strategy("Mirrored", info, cpu_replicas=args.cpu_replicas)
    print(f"Number of devices: {strategy.num_replicas_in_sync}", flush=True)
    kt.prepare(info)
    batch_size = args.batch_size * strategy.num_replicas_in_sync
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train))
        .repeat()
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    with strategy.scope():
        model = build_model(tf)

    def decay(epoch):  # the tutorial's learning-rate schedule
        return 1e-3 if epoch < 3 else (1e-4 if epoch < 7 else 1e-5)

    callbacks = kt.standard_callbacks(
        info,
        backup_freq=kargs.backup_freq(args.backup_freq),
        save_before_preemption=not args.no_preemption_checkpoint,
    )
    callbacks.insert(0, tf.keras.callbacks.LearningRateScheduler(decay))
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0, callbacks=callbacks)
    kt.finish(model, info, epochs=args.epochs, history=history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
