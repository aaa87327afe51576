"""Parameter server training with a custom training loop (TensorFlow's guide, "Training with a custom training
loop"): ParameterServerStrategy, tf.distribute.coordinator.ClusterCoordinator and `coordinator.schedule`, run as a
TrainingJob with `strategy: ParameterServer` (one chief, workers, ps).

Written as the guide writes it, without kubetf's helper library: the chief is the coordinator, workers and ps
run `tf.distribute.Server(...).join()`. The data is the guide's own synthetic set (`feature_and_label_gen`):
replace that function to train on yours.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3 cannot train with ParameterServerStrategy
os.environ["GRPC_FAIL_FAST"] = "use_caller"  # the guide: lets the coordinator notice lost workers and ps

import tensorflow as tf

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]
LABEL_VOCAB = ["yes", "no"]


def feature_and_label_gen(num_examples=200):
    """Where the data comes from (the guide's synthetic examples)."""
    examples = {"features": [], "label": []}
    for _ in range(num_examples):
        features = random.sample(FEATURE_VOCAB, 3)
        label = ["yes"] if "avenger" in features else ["no"]
        examples["features"].append(features)
        examples["label"].append(label)
    return examples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=5)
    args = parser.parse_args(argv)

    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster_resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(
            cluster_resolver.cluster_spec(),
            job_name=cluster_resolver.task_type,
            task_index=cluster_resolver.task_id,
            protocol=cluster_resolver.rpc_layer or "grpc",
            start=True,
        )
        server.join()

    num_ps = len(cluster_resolver.cluster_spec().as_dict().get("ps", []))
    variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=(256 << 10), max_shards=num_ps
    )
    strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

    with strategy.scope():
        feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=FEATURE_VOCAB, mask_token=None)
        label_lookup_layer = tf.keras.layers.StringLookup(vocabulary=LABEL_VOCAB, num_oov_indices=0, mask_token=None)
        raw_feature_input = tf.keras.layers.Input(shape=(3,), dtype=tf.string, name="features")
        feature_id_input = feature_lookup_layer(raw_feature_input)
        feature_preprocess_stage = tf.keras.Model({"features": raw_feature_input}, feature_id_input)
        raw_label_input = tf.keras.layers.Input(shape=(1,), dtype=tf.string, name="label")
        label_id_input = label_lookup_layer(raw_label_input)
        label_preprocess_stage = tf.keras.Model({"label": raw_label_input}, label_id_input)

    examples = feature_and_label_gen()

    def dataset_fn(_):
        raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
        train_dataset = (
            raw_dataset.map(
                lambda x: (
                    {"features": feature_preprocess_stage(x["features"])},
                    label_preprocess_stage(x["label"]),
                )
            )
            .shuffle(200)
            .batch(32)
            .repeat()
        )
        return train_dataset

    with strategy.scope():
        model_input = tf.keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
        emb_layer = tf.keras.layers.Embedding(input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
        emb_output = tf.reduce_mean(emb_layer(model_input), axis=1)
        dense_output = tf.keras.layers.Dense(
            units=1, activation="sigmoid", kernel_regularizer=tf.keras.regularizers.L2(1e-4)
        )(emb_output)
        model = tf.keras.Model({"features": model_input}, dense_output)
        optimizer = tf.keras.optimizers.legacy.RMSprop(learning_rate=0.1)
        accuracy = tf.keras.metrics.Accuracy()

    @tf.function
    def step_fn(iterator):
        def replica_fn(batch_data, labels):
            with tf.GradientTape() as tape:
                pred = model(batch_data, training=True)
                per_example_loss = tf.keras.losses.BinaryCrossentropy(reduction=tf.keras.losses.Reduction.NONE)(
                    labels, pred
                )
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
            accuracy.update_state(labels, actual_pred)
            return loss

        batch_data, labels = next(iterator)
        losses = strategy.run(replica_fn, args=(batch_data, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    for i in range(args.epochs):
        accuracy.reset_states()
        for _ in range(args.steps_per_epoch):
            coordinator.schedule(step_fn, args=(per_worker_iterator,))
        # Wait at epoch boundaries.
        coordinator.join()
        print(f"Finished epoch {i}, accuracy is {accuracy.result().numpy():f}.", flush=True)

    loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
    print(f"Final loss is {loss.fetch():f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
