"""TF1 between-graph parameter-server training (tf.compat.v1, MonitoredTrainingSession): the layout of Kubeflow's
classic dist-mnist TFJob, run as a TrainingJob with `strategy: Independent`.

ps tasks hold the variables and serve until stopped; every worker builds its own copy of the graph and updates
the variables asynchronously; worker 0 is the chief (no chief task needed: it initialises or restores the
variables and writes checkpoints); every worker exits 0 once the global step reaches --train-steps.
When a ps is lost, MonitoredTrainingSession recreates its session, the chief restores the variables from its
latest checkpoint, and every worker prints a `resumed` line with the global step it goes on from.
Only the data loading (`load_data`) is specific to this machine. --checkpoint-dir must be shared by the chief and
the ps tasks: each ps writes the shard of the variables it holds (a TrainingJob's `checkpoint` volume, the default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf


def load_data():
    """Where the data comes from: scikit-learn's bundled 8x8 digits (no download). Replace with your own."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def say(kind, task, **fields):
    print(json.dumps({"tf1": kind, "task": task, **fields}), flush=True)


class SessionHook(tf.compat.v1.train.SessionRunHook):
    """Says at which global step each session starts: after the first, a recovered one (a ps came back and the
    chief restored the variables from its checkpoint)."""

    def __init__(self, task, global_step):
        self.task, self.global_step, self.sessions = task, global_step, 0

    def after_create_session(self, session, coord):
        step = int(session.run(self.global_step))
        self.sessions += 1
        say("session" if self.sessions == 1 else "resumed", self.task, step=step)


class StopAtStep(tf.compat.v1.train.StopAtStepHook):
    """StopAtStepHook that keeps the global step it stopped on. With asynchronous updates the step a worker
    fetched with its train op may be behind the variable: the stop is decided on a fresh read of it, which is
    the one to report."""

    def __init__(self, last_step, global_step):
        super().__init__(last_step=last_step)
        self.global_step, self.stopped_at = global_step, None

    def after_run(self, run_context, run_values):
        super().after_run(run_context, run_values)
        if run_context.stop_requested and self.stopped_at is None:
            self.stopped_at = int(run_context.session.run(self.global_step))


def hold(task, step, release):
    say("held", task, step=step)
    while not os.path.exists(release):
        time.sleep(0.2)
    say("released", task)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=3000, help="global steps, over all workers")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--checkpoint-steps", type=int, default=200)
    parser.add_argument("--log-steps", type=int, default=100)
    parser.add_argument(
        "--checkpoint-dir",
        default=os.path.join(os.environ.get("KUBETF_CHECKPOINT_DIR") or tempfile.gettempdir(), "tf1-between-graph"),
    )
    parser.add_argument(
        "--hold-at-step",
        type=int,
        help="pause each worker once the global step reaches this, until the file `release` exists in "
        "--checkpoint-dir: to act on the job at a known point (a test deletes its ps there)",
    )
    args = parser.parse_args(argv)

    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    task_type, task_index = tf_config["task"]["type"], int(tf_config["task"]["index"])
    task = f"{task_type}-{task_index}"
    tf.compat.v1.disable_eager_execution()
    server = tf.compat.v1.train.Server(cluster, job_name=task_type, task_index=task_index)
    if task_type == "ps":
        say("serving", task)
        server.join()  # until the platform stops it
        return 0

    # TF1's chief: the chief task, or worker 0 when the cluster has none.
    is_chief = task_type == "chief" or (task_type == "worker" and task_index == 0 and "chief" not in cluster.jobs)
    x_train, y_train = load_data()
    with tf.compat.v1.device(
        tf.compat.v1.train.replica_device_setter(worker_device=f"/job:{task_type}/task:{task_index}", cluster=cluster)
    ):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, x_train.shape[1]])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        weights = tf.compat.v1.get_variable(
            "weights", [x_train.shape[1], 10], initializer=tf.compat.v1.zeros_initializer()
        )
        bias = tf.compat.v1.get_variable("bias", [10], initializer=tf.compat.v1.zeros_initializer())
        logits = tf.matmul(x, weights) + bias
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).minimize(
            loss, global_step=global_step
        )

    # Each worker talks to the ps tasks only: it neither waits for nor fails with the other workers.
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:{task_type}/task:{task_index}"])
    say("start", task, chief=is_chief, checkpoint=tf.train.latest_checkpoint(args.checkpoint_dir) if is_chief else None)
    rng = np.random.default_rng(task_index + (100 if task_type == "chief" else 0))
    step = None
    stop = StopAtStep(args.train_steps, global_step)
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.checkpoint_dir,
        save_checkpoint_steps=args.checkpoint_steps,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        hooks=[stop, SessionHook(task, global_step)],
        config=config,
    ) as session:
        while not session.should_stop():
            if args.hold_at_step is not None and step is not None and step >= args.hold_at_step:
                hold(task, int(step), os.path.join(args.checkpoint_dir, "release"))
                args.hold_at_step = None
            batch = rng.integers(0, len(x_train), args.batch_size)
            last = step
            _, step, loss_value, accuracy_value = session.run(
                [train_op, global_step, loss, accuracy], feed_dict={x: x_train[batch], y: y_train[batch]}
            )
            if last is None or step // args.log_steps != last // args.log_steps:
                say("progress", task, step=int(step), loss=float(loss_value), accuracy=float(accuracy_value))
    say("done", task, step=stop.stopped_at if stop.stopped_at is not None else int(step or 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
