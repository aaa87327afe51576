"""Setup shared by every process of one pytest run, whether xdist runs it on several workers or not.

Each piece (the images and the chart for e2e, the installed operator paused for integration, the integration tier's
admission policy) is done once per run, by whichever process needs it first, under a file lock in the run's base
temporary directory; what must be undone is undone once, by the process that ends the run (xdist's controller, or
the only process), in `pytest_sessionfinish`. Fixtures call `once`; undo steps register with `undo_at_end`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def run_dir(config: pytest.Config) -> Path:
    """A directory that belongs to this run, the same for every worker: xdist gives each worker a base temporary
    directory inside the controller's."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return Path(base).parent if hasattr(config, "workerinput") else Path(base)


@contextlib.contextmanager
def once(config: pytest.Config, name: str) -> Iterator[bool]:
    """Yields True to the first process of the run that asks for `name`, False to the others, which wait until the
    first one's block is done. A block that raised is tried again by the next process that asks."""
    directory = run_dir(config)
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = directory / f"{name}.done"
        first = not done.exists()
        yield first
        if first:
            done.touch()


def undo_at_end(config: pytest.Config, step: str, **arguments: Any) -> None:
    """Record an undo step (a name `pytest_sessionfinish` knows, with its arguments) for the end of the run."""
    with open(run_dir(config) / "undo.jsonl", "a") as out:
        out.write(json.dumps({"step": step, **arguments}) + "\n")


def undo_steps(config: pytest.Config) -> list[dict[str, Any]]:
    path = run_dir(config) / "undo.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
