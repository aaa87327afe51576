"""Who am I in the job: TF_CONFIG and the KUBETF_* variables the operator injects; where my files are.

Pure Python (no TensorFlow import), so tools can use it too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("MultiWorkerMirrored", "ParameterServer", "Mirrored", "Independent")
TRAINING_ROLES = ("chief", "worker", "ps")


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the job.

    ``role`` is ``chief``/``worker``/``ps``/``evaluator``; a process started without TF_CONFIG or
    KUBETF_ROLE is a standalone ``worker`` 0.
    """

    role: str = "worker"
    index: int = 0
    strategy: str = "Mirrored"
    job_name: str = "local"
    checkpoint_root: str | None = None
    cluster: dict[str, list[str]] = field(default_factory=dict)
    tf_config: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        """The task that writes checkpoints and the final model (chief, else worker 0)."""
        if self.role == "chief":
            return True
        return self.role == "worker" and self.index == 0 and not self.cluster.get("chief")

    @property
    def is_evaluator(self) -> bool:
        return self.role == "evaluator"

    @property
    def is_ps_server(self) -> bool:
        """A ParameterServer worker or ps: it only runs a tf.distribute.Server."""
        return self.strategy == "ParameterServer" and self.role in ("worker", "ps")

    @property
    def num_workers(self) -> int:
        """Training tasks that run the model (chief + workers), at least 1."""
        return max(1, len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", [])))

    @property
    def checkpoint_dir(self) -> str:
        """The shared checkpoint volume; a per-job temp directory when none is mounted."""
        if self.checkpoint_root:
            return self.checkpoint_root
        return os.path.join(tempfile.gettempdir(), "kubetf", self.job_name)

    @property
    def backup_dir(self) -> str:
        return os.path.join(self.checkpoint_dir, "backup")

    @property
    def checkpoints_dir(self) -> str:
        """Per-epoch weights (``ckpt-0001`` ...) read by the evaluator."""
        return os.path.join(self.checkpoint_dir, "checkpoints")

    @property
    def tensorboard_dir(self) -> str:
        """TensorBoard logs: the chief's training scalars, the evaluator's under ``eval/``."""
        return os.path.join(self.checkpoint_dir, "tensorboard")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.checkpoint_dir, "model")

    @property
    def done_marker(self) -> str:
        return os.path.join(self.checkpoints_dir, "done")


def _infer_strategy(cluster: dict[str, list[str]]) -> str:
    if cluster.get("ps"):
        return "ParameterServer"
    if len(cluster.get("chief", [])) + len(cluster.get("worker", [])) > 1:
        return "MultiWorkerMirrored"
    return "Mirrored"


def task_info(environ: dict[str, str] | None = None) -> TaskInfo:
    """Read TF_CONFIG and KUBETF_* (``environ`` defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    raw = env.get("TF_CONFIG", "")
    tf_config: dict[str, Any] = json.loads(raw) if raw.strip() else {}
    cluster = {str(k): list(v) for k, v in (tf_config.get("cluster") or {}).items()}
    task = tf_config.get("task") or {}
    role = env.get("KUBETF_ROLE") or task.get("type") or "worker"
    index = int(env.get("KUBETF_INDEX") or task.get("index") or 0)
    strategy = env.get("KUBETF_STRATEGY") or _infer_strategy(cluster)
    if strategy not in STRATEGIES:
        raise ValueError(f"KUBETF_STRATEGY={strategy!r}: expected one of {', '.join(STRATEGIES)}")
    return TaskInfo(
        role=role,
        index=index,
        strategy=strategy,
        job_name=env.get("KUBETF_JOB_NAME") or "local",
        checkpoint_root=env.get("KUBETF_CHECKPOINT_DIR") or None,
        cluster=cluster,
        tf_config=tf_config,
    )


def clear_backup_scratch(backup_dir: str, task_id: int) -> bool:
    """Delete ``backup_dir/workertemp_<task_id>``, a non-chief MultiWorkerMirrored worker's scratch copy
    of the backup; returns whether there was one. Call it before BackupAndRestore builds its state.

    Every worker must take part in a save, so tf-keras has the non-chief ones save there and deletes the
    directory after each save: it never holds anything to keep. A worker killed during that delete leaves
    a ``checkpoint`` file naming deleted data, and every restart fails with NotFoundError: the
    PreemptionCheckpointHandler (ours, or tf-keras' own on GCP) first restores from this scratch directory.
    """
    path = os.path.join(backup_dir, f"workertemp_{task_id}")  # tf-keras' distributed_file_utils name
    if not os.path.isdir(path):
        return False
    shutil.rmtree(path)
    return True
