"""Custom training loop with Keras and MultiWorkerMirroredStrategy (TensorFlow's tutorial), checkpointed with
tf.train.CheckpointManager, run as a TrainingJob with `strategy: MultiWorkerMirrored`.

Written as the tutorial writes it, without kubetf's helper library. The chief (the `chief` task, else worker 0)
writes checkpoints of the model, the epoch and the step in the epoch to the shared --checkpoint-dir; the other
workers write to a temporary directory they delete. When the group restarts (a worker was evicted), every worker
restores the chief's latest checkpoint and prints where it resumed. Only `mnist_dataset` (where the data comes
from) and the checkpoint directory (the job's checkpoint volume) differ from the tutorial. Like the tutorial, it does
nothing on SIGTERM (TensorFlow swallows it; kubetf stops the pod at once, see the README's "SIGTERM").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3 cannot distribute with MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf


def mnist_dataset():
    """Where the data comes from: MNIST-shaped 28x28 images. Here scikit-learn's bundled 8x8 digits (no download),
    scaled 3x and centred; replace with `tf.keras.datasets.mnist.load_data()` or your own."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.kron(digits.images / 16.0, np.ones((3, 3)))
    x_train = np.pad(x, ((0, 0), (2, 2), (2, 2))).astype(np.float32)
    return x_train, digits.target.astype(np.int64)


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    x_train, y_train = mnist_dataset()
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train)).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


def build_cnn_model():
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


def _is_chief(task_type, task_id, cluster_spec):
    return (
        task_type is None
        or task_type == "chief"
        or (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict())
    )


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--per-worker-batch-size", type=int, default=64)
    parser.add_argument(
        "--checkpoint-dir",
        default=os.path.join(os.environ.get("KUBETF_CHECKPOINT_DIR") or "/tmp", "ckpt"),
        help="shared by every worker (default: the job's checkpoint volume)",
    )
    args = parser.parse_args(argv)

    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    num_workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    global_batch_size = args.per_worker_batch_size * max(1, num_workers)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        multi_worker_model = build_cnn_model()
        multi_worker_dataset = strategy.distribute_datasets_from_function(
            lambda input_context: dataset_fn(global_batch_size, input_context)
        )
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    @tf.function
    def train_step(iterator):
        """Training step function."""

        def step_fn(inputs):
            """Per-Replica step function."""
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction=tf.keras.losses.Reduction.NONE
                )(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables, strict=True))
            train_accuracy.update_state(y, predictions)
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
    step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")
    task_type, task_id, cluster_spec = (
        strategy.cluster_resolver.task_type,
        strategy.cluster_resolver.task_id,
        strategy.cluster_resolver.cluster_spec(),
    )

    checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)
    write_checkpoint_dir = write_filepath(args.checkpoint_dir, task_type, task_id, cluster_spec)
    checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

    # Restoring the checkpoint: every worker reads the chief's.
    latest_checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir)
    if latest_checkpoint:
        checkpoint.restore(latest_checkpoint)
        step = int(epoch.numpy()) * args.steps_per_epoch + int(step_in_epoch.numpy())
        print(f"Resumed from {latest_checkpoint} at epoch {int(epoch.numpy())}, step {step}.", flush=True)

    while epoch.numpy() < args.epochs:
        iterator = iter(multi_worker_dataset)
        total_loss = 0.0
        num_batches = 0

        while step_in_epoch.numpy() < args.steps_per_epoch:
            total_loss += train_step(iterator)
            num_batches += 1
            step_in_epoch.assign_add(1)

        train_loss = total_loss / num_batches
        print(
            f"Epoch: {int(epoch.numpy())}, accuracy: {float(train_accuracy.result()):f}, "
            f"train_loss: {float(train_loss):f}.",
            flush=True,
        )
        train_accuracy.reset_states()

        # Saved after moving to the next epoch (the tutorial saves before): a restored checkpoint then starts a
        # fresh epoch instead of one whose steps are all done, with no batches to average the loss over.
        epoch.assign_add(1)
        step_in_epoch.assign(0)
        checkpoint_manager.save()
        if not _is_chief(task_type, task_id, cluster_spec):
            tf.io.gfile.rmtree(write_checkpoint_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
