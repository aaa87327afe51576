"""kubetf_trainer: helpers for TensorFlow programs run by kubetf.

Light imports (no TensorFlow): ``task_info``, ``TaskInfo``, ``emit``, ``data``, ``report`` (progress reports to
the operator: ``kubetf_trainer.report.report``).
TensorFlow-backed (imported on first use): ``make_strategy``, ``run_server``, ``callbacks``,
``BackupAndRestore``, ``Progress``, ``TensorBoard``, ``prepare``, ``save_model``, ``finish``,
``evaluate_checkpoints``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from .env import TaskInfo, task_info
from .progress import emit
from .signals import exit_on_sigterm

__version__ = "0.1.0"

_LAZY = {
    "make_strategy": "strategy",
    "run_server": "strategy",
    "gpu_count": "strategy",
    "standard_callbacks": "training",
    "prepare": "training",
    "save_model": "training",
    "finish": "training",
    "evaluate_checkpoints": "training",
    "checkpoint_epochs": "training",
    "BackupAndRestore": "callbacks",
    "Progress": "callbacks",
    "TensorBoard": "callbacks",
    "PREEMPTION_EXIT_CODE": "callbacks",
    "data": None,
    "report": None,
    "args": None,
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kubetf_trainer' has no attribute {name!r}")
    module = _LAZY[name]
    if module is None:
        return importlib.import_module(f".{name}", __name__)
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["TaskInfo", "__version__", "emit", "exit_on_sigterm", "task_info", *_LAZY]
