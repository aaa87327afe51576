"""Multi-worker training with Keras (TensorFlow tutorial): the MNIST CNN, MultiWorkerMirroredStrategy
and Model.fit, run as one task of a kubetf TrainingJob (strategy: MultiWorkerMirrored).

Same program on every replica: chief/workers train (the whole group restarts together and resumes
from the BackupAndRestore backup; SIGTERM saves and exits 42); an evaluator replica evaluates each
epoch's checkpoint. Only the data loading differs from the tutorial (see --data).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kubetf_trainer

import kubetf_trainer as kt
from kubetf_trainer import args as kargs


def mnist_dataset(tf, x, y, batch_size, shuffle=True):
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        dataset = dataset.shuffle(len(x))
    dataset = dataset.repeat().batch(batch_size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def build_and_compile_cnn_model(tf, learning_rate):
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=learning_rate),
        metrics=["accuracy"],
    )
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kargs.add_arguments(parser, epochs=3, steps_per_epoch=70, batch_size=64, learning_rate=0.01)
    args = parser.parse_args(argv)
    info = kargs.task(args)
    (x_train, y_train), (x_test, y_test) = kargs.load_data(args, info)

    import tensorflow as tf

    if info.is_evaluator:
        model = build_and_compile_cnn_model(tf, args.learning_rate)
        test = mnist_dataset(tf, x_test, y_test, args.batch_size, shuffle=False)
        steps = args.eval_steps or max(1, len(x_test) // args.batch_size)
        kt.evaluate_checkpoints(model, test, info, steps=steps, idle_timeout=args.eval_idle_timeout)
        return 0

    strategy = kt.make_strategy("MultiWorkerMirrored", info)
    kt.prepare(info)
    global_batch_size = args.batch_size * strategy.num_replicas_in_sync
    train = mnist_dataset(tf, x_train, y_train, global_batch_size)
    with strategy.scope():
        model = build_and_compile_cnn_model(tf, args.learning_rate)
    history = model.fit(
        train,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=0,
        callbacks=kt.standard_callbacks(
            info,
            backup_freq=kargs.backup_freq(args.backup_freq),
            save_before_preemption=not args.no_preemption_checkpoint,
            hold_after_epoch=args.hold_after_epoch,
            fail_after_epoch=args.fail_after_epoch,
        ),
    )
    kt.finish(model, info, epochs=args.epochs, history=history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
