"""One JSON object per line on stdout: the format kubetf tools parse (`kubetf.cli.jobctl.progress_line`)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any, TextIO

from .env import TaskInfo, task_info


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / tf scalars
        with contextlib.suppress(TypeError, ValueError):
            value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def emit(kind: str, info: TaskInfo | None = None, *, out: TextIO | None = None, **fields: Any) -> dict[str, Any]:
    """Print ``{"kubetf": kind, "role": ..., "index": ..., **fields}`` as one line (to ``out``, default
    ``sys.stdout``) and return it."""
    info = info or task_info()
    record: dict[str, Any] = {"kubetf": kind, "role": info.role, "index": info.index}
    record.update({k: _clean(v) for k, v in fields.items()})
    stream = out or sys.stdout
    stream.write(json.dumps(record, sort_keys=False) + "\n")
    stream.flush()
    return record
