"""Parameter server training with Keras Model.fit (TensorFlow tutorial), run as a kubetf TrainingJob
(strategy: ParameterServer).

The same program on every replica: the chief is the coordinator (ParameterServerStrategy +
Model.fit with a DatasetCreator), workers and ps run ``tf.distribute.Server(...).join()``, and the
evaluator (outside the training cluster) evaluates each epoch's checkpoint, the tutorial's
"sidecar evaluation". Only the data loading differs from the tutorial (see --data).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kubetf_trainer

import kubetf_trainer as kt
from kubetf_trainer import args as kargs


def build_model(tf, learning_rate, steps_per_execution=1):
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.legacy.SGD(learning_rate=learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kargs.add_arguments(parser, epochs=4, steps_per_epoch=20, batch_size=64, learning_rate=0.1)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument(
        "--train-examples", type=int, default=10000, help="examples shipped to the workers inside the dataset function"
    )
    args = parser.parse_args(argv)
    info = kargs.task(args)

    import tensorflow as tf

    if info.is_ps_server:  # workers and parameter servers: serve until the job is done
        kt.run_server(info)

    (x_train, y_train), (x_test, y_test) = kargs.load_data(args, info)
    x_train, y_train = x_train[: args.train_examples], y_train[: args.train_examples]

    if info.is_evaluator:
        model = build_model(tf, args.learning_rate)
        test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)
        kt.evaluate_checkpoints(model, test, info, steps=args.eval_steps, idle_timeout=args.eval_idle_timeout)
        return 0

    num_ps = len(info.cluster.get("ps", [])) or 1
    variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=(256 << 10), max_shards=num_ps
    )
    strategy = kt.make_strategy("ParameterServer", info, variable_partitioner=variable_partitioner)
    kt.prepare(info)

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(args.batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train)).repeat()
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.batch(batch_size).prefetch(2)

    with strategy.scope():
        model = build_model(tf, args.learning_rate, args.steps_per_execution)

    history = model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=0,
        callbacks=kt.standard_callbacks(
            info, backup_freq=kargs.backup_freq(args.backup_freq), fail_after_epoch=args.fail_after_epoch
        ),
    )
    kt.finish(model, info, epochs=args.epochs, history=history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
