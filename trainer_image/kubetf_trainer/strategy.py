"""Build the tf.distribute strategy that fits this task's role and the job's strategy."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, NoReturn

from . import peers, phases
from .env import TaskInfo, task_info
from .signals import exit_on_sigterm, reinstall_sigterm_handler

log = logging.getLogger("kubetf_trainer")


def _tf() -> Any:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    return tf


def gpu_count() -> int:
    return len(_tf().config.list_physical_devices("GPU"))


def run_server(info: TaskInfo | None = None) -> NoReturn:
    """ParameterServer worker/ps: serve the cluster until killed (never returns)."""
    tf = _tf()
    info = info or task_info()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    # The tutorial's worker_config: with fewer inter-op threads than workers + 1 the servers deadlock
    # (seen: TF_NUM_INTEROP_THREADS=1, which a CPU limit of 1 gives, hangs the first training step).
    config = tf.compat.v1.ConfigProto()
    wanted = len(resolver.cluster_spec().as_dict().get("worker", [])) + 1
    configured = int(os.environ.get("TF_NUM_INTEROP_THREADS") or 0)
    if configured and configured < wanted:
        os.environ["TF_NUM_INTEROP_THREADS"] = str(wanted)
    config.inter_op_parallelism_threads = max(configured, wanted)
    if os.environ.get("TF_NUM_INTRAOP_THREADS"):
        config.intra_op_parallelism_threads = int(os.environ["TF_NUM_INTRAOP_THREADS"])
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        config=config,
        start=True,
    )
    exit_on_sigterm()  # before saying it serves: whoever reads that line may stop it right away
    phases.mark(phases.SERVING, info)
    print(f"kubetf_trainer: {info.role} {info.index} serving on {server.target}", flush=True)
    # The server runs on its own threads. Sleep in Python rather than in server.join(), so that the
    # SIGTERM handler can run (a signal handler never runs while the main thread waits inside C++).
    while True:
        time.sleep(3600)


def make_strategy(
    kind: str | None = None,
    info: TaskInfo | None = None,
    *,
    variable_partitioner: Any = None,
    cpu_replicas: int = 1,
) -> Any:
    """The strategy for this process.

    - ``MultiWorkerMirrored``: MWMS with RING collectives on CPU, NCCL when GPUs are visible.
    - ``ParameterServer``: on the chief (coordinator) a ParameterServerStrategy over the TF_CONFIG
      cluster; on workers and ps this call serves the cluster and never returns (see ``run_server``).
    - ``Mirrored``: MirroredStrategy over the local GPUs (or ``cpu_replicas`` logical CPUs).
    - ``Independent`` (TF1 between-graph, Estimator: programs that only read TF_CONFIG) and the evaluator
      get the default (no-op) strategy: the program distributes itself.

    ``kind`` defaults to ``KUBETF_STRATEGY`` (or what TF_CONFIG implies).
    """
    tf = _tf()
    info = info or task_info()
    kind = kind or info.strategy
    if info.strategy != kind and os.environ.get("KUBETF_STRATEGY"):
        log.warning("kubetf_trainer: job strategy is %s but this program uses %s", info.strategy, kind)
    if info.is_evaluator or kind == "Independent":
        return tf.distribute.get_strategy()
    began = time.time()
    strategy = _make(tf, kind, info, variable_partitioner, cpu_replicas)
    phases.mark(phases.CLUSTER, info, seconds=round(time.time() - began, 3))
    # A failure ends this process at once, and a MultiWorkerMirrored group with it (see kubetf_trainer.peers).
    peers.fail_fast(tell_peers=kind == "MultiWorkerMirrored")
    if kind == "MultiWorkerMirrored":
        peers.watch(info)
    return strategy


def _make(tf: Any, kind: str, info: TaskInfo, variable_partitioner: Any, cpu_replicas: int) -> Any:
    if kind == "MultiWorkerMirrored":
        impl = (
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if gpu_count()
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        options = tf.distribute.experimental.CommunicationOptions(implementation=impl)
        peers.configure(tf, info)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        reinstall_sigterm_handler()  # exit 143 until BackupAndRestore's PreemptionCheckpointHandler takes over
        return strategy
    if kind == "ParameterServer":
        if info.role in ("worker", "ps"):
            run_server(info)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=variable_partitioner)
    if kind == "Mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        if cpu_replicas > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpu_replicas)]
            )
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            return tf.distribute.MirroredStrategy(devices=devices)
        return tf.distribute.MirroredStrategy()
    raise ValueError(f"unknown strategy {kind!r}")
