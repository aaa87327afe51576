"""Command-line flags shared by the examples."""

from __future__ import annotations

import argparse
import os

from . import data
from .env import TaskInfo, task_info
from .signals import exit_on_sigterm


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    epochs: int = 3,
    steps_per_epoch: int = 50,
    batch_size: int = 64,
    learning_rate: float = 0.01,
) -> argparse.ArgumentParser:
    g = parser.add_argument_group("kubetf")
    g.add_argument(
        "--data",
        choices=data.KINDS,
        default="auto",
        help="auto: MNIST if cached or downloadable, else scikit-learn digits (default)",
    )
    g.add_argument(
        "--data-dir",
        default=None,
        help="MNIST cache directory (default: $KUBETF_CHECKPOINT_DIR/data, else ~/.keras/datasets)",
    )
    g.add_argument("--epochs", type=int, default=epochs)
    g.add_argument("--steps-per-epoch", type=int, default=steps_per_epoch)
    g.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        help="per worker (MWMS) / per replica (Mirrored) / global (ParameterServer)",
    )
    g.add_argument("--learning-rate", type=float, default=learning_rate)
    g.add_argument(
        "--checkpoint-dir", default=None, help="overrides $KUBETF_CHECKPOINT_DIR (default: a temp dir per job)"
    )
    g.add_argument("--backup-freq", default="epoch", help="BackupAndRestore save_freq: 'epoch' or a number of steps")
    g.add_argument("--no-preemption-checkpoint", action="store_true", help="do not save on SIGTERM (MWMS/Mirrored)")
    g.add_argument(
        "--hold-after-epoch",
        type=int,
        default=None,
        help="tests: wait after this epoch until $KUBETF_CHECKPOINT_DIR/release exists (or SIGTERM)",
    )
    g.add_argument(
        "--fail-after-epoch",
        default=None,
        help="tests: ROLE-INDEX:EPOCH, that task's program exits 1 at the end of that epoch, once (its marker in "
        "$KUBETF_CHECKPOINT_DIR)",
    )
    g.add_argument("--eval-steps", type=int, default=None, help="evaluator: batches per evaluation")
    g.add_argument(
        "--eval-idle-timeout",
        type=float,
        default=None,
        help="evaluator: stop after this many seconds without a new checkpoint",
    )
    return parser


def backup_freq(value: str) -> str | int:
    return "epoch" if value == "epoch" else int(value)


def task(args: argparse.Namespace) -> TaskInfo:
    """TaskInfo after applying ``--checkpoint-dir``."""
    if args.checkpoint_dir:
        os.environ["KUBETF_CHECKPOINT_DIR"] = args.checkpoint_dir
    exit_on_sigterm()
    return task_info()


def load_data(args: argparse.Namespace, info: TaskInfo) -> data.Arrays:
    cache = args.data_dir or (os.path.join(info.checkpoint_root, "data") if info.checkpoint_root else None)
    return data.load(args.data, cache_dir=cache)
