"""The phases of a run, one timestamped JSON line each (``emit``), so that a restart's cost can be split: how long
the process took to start, to import TensorFlow, to form the cluster, to restore the checkpoint, to train a step.

```
{"kubetf": "phase", "role": "worker", "index": 1, "phase": "started", "time": 1764300000.12, "pid": 7}
{"kubetf": "phase", "role": "worker", "index": 1, "phase": "imported", "time": 1764300006.3, "seconds": 5.9}
{"kubetf": "phase", "role": "worker", "index": 1, "phase": "cluster", "time": 1764300007.0, "seconds": 0.4}
{"kubetf": "phase", "role": "worker", "index": 1, "phase": "restored", "time": 1764300007.9, "seconds": 0.2, "step": 20}
{"kubetf": "phase", "role": "worker", "index": 1, "phase": "first_step", "time": 1764300010.1, "step": 41}
```

- ``started``: the process began (the kernel's start time of it, not when Python got here); said by the image's
  ``sitecustomize``, at interpreter start;
- ``imported``: ``import tensorflow`` finished (``seconds``: the import itself); an import hook ``sitecustomize``
  installs;
- ``cluster``: the strategy was made (``make_strategy``; ``seconds``: making it): MultiWorkerMirrored's tasks all
  joined (its constructor waits for them), the coordinator connected to the ParameterServer cluster;
- ``serving``: a ParameterServer worker or ps serves (``run_server``);
- ``restored``: ``BackupAndRestore`` restored (``step``: the global steps the backup held, 0 for none; ``seconds``:
  the restore);
- ``first_step``: the run's first training step is done (``Progress``; ``step``: its global step).

Each phase is said once per process; ``time`` is the wall clock (``time.time()``), which every process of one machine
shares with the kubelet's and the API server's clocks. Only the tasks of a job say anything (``TF_CONFIG`` or
``KUBETF_ROLE`` set), never a process they start (it inherits ``KUBETF_PHASES_PID``); ``KUBETF_PHASES=0`` turns the
lines off. Standard library only: ``sitecustomize`` imports this at interpreter start.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import imports
from .env import TaskInfo
from .progress import emit

ENV_OFF = "KUBETF_PHASES"
ENV_PID = "KUBETF_PHASES_PID"  # the process that says the phases; a child inherits it and says nothing

STARTED, IMPORTED, CLUSTER, SERVING, RESTORED, FIRST_STEP = (
    "started", "imported", "cluster", "serving", "restored", "first_step",
)  # fmt: skip

_said: set[str] = set()


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """This process says its phases: a task of a job (TF_CONFIG or KUBETF_ROLE), not a process one of them started,
    and not turned off."""
    env = os.environ if environ is None else environ
    if env.get(ENV_OFF, "1").strip().lower() in ("0", "false", "no"):
        return False
    if not (env.get("TF_CONFIG") or env.get("KUBETF_ROLE")):
        return False
    return env.get(ENV_PID, str(os.getpid())) == str(os.getpid())


def mark(phase: str, info: TaskInfo | None = None, at: float | None = None, **fields: Any) -> dict[str, Any] | None:
    """Say that ``phase`` was reached (at ``at``, default now), the first time only. Never raises: a phase line is
    never worth a failed program."""
    if phase in _said or not enabled():
        return None
    _said.add(phase)
    try:
        # To the process's own stdout: a program may redirect sys.stdout meanwhile (the library's data loading
        # does, around TensorFlow's first import).
        out = sys.__stdout__ or sys.stdout
        return emit("phase", info, out=out, phase=phase, time=round(time.time() if at is None else at, 3), **fields)
    except Exception:
        return None


def process_start_time(pid: int | str = "self") -> float | None:
    """When the process began, on the wall clock: its start in clock ticks after boot (/proc/PID/stat) placed on the
    boot clock (CLOCK_BOOTTIME, which that count follows), to 1/CLK_TCK s. None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime: after "pid (comm) "
        booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def install(environ: Mapping[str, str] | None = None) -> bool:
    """At interpreter start: say ``started``, and say ``imported`` when TensorFlow's import ends. Returns whether this
    process says its phases."""
    if not enabled(environ):
        return False
    os.environ[ENV_PID] = str(os.getpid())
    mark(STARTED, at=process_start_time(), pid=os.getpid())
    if "tensorflow" not in sys.modules and not any(isinstance(f, _ImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportFinder())
    return True


class _ImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``tensorflow`` it asks the other finders and wraps the loader, which says
    ``imported`` once the module ran; then it leaves ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        try:
            sys.meta_path.remove(self)  # the others find it; and no import after this one pays for a look here
            return imports.find_wrapped(self, fullname, path, target, _timed)
        except Exception:
            return None


def _timed(module: Any, run: Callable[[], None]) -> None:
    began = time.time()
    run()
    mark(IMPORTED, seconds=round(time.time() - began, 3))
