"""One run of a job at a time writes its checkpoint directory: the run that holds it.

A *run* is one TrainingJob object's pods: ``KUBETF_RUN_ID``, the job's uid on the cluster it runs on (the operator
sets it). Every restart of the job's pods is the same run; a job deleted and made again, or a MultiKueue job
dispatched again to another worker (a new copy of the job there), is a new run. Two runs reach one directory only
through storage they share (an ``existingClaim`` on a filesystem every cluster mounts): then the run that holds the
directory writes, and another waits, without training, until the holder has ended (it exited through this library,
or it has been silent for the lease), and then takes it over and resumes from what the holder wrote. Waiting, not
taking over a live holder: a worker cut off from MultiKueue's manager keeps its copy training, and Kueue (v0.19)
keeps that older copy when the worker is reachable again (docs/kueue.md, "A lost worker").

On disk, under ``<checkpoint dir>/.kubetf-fence/``:

- ``claims/<generation>/owner``: the run that took the directory at that generation; the highest generation holds
  it. A run takes it by creating the next generation's directory (``mkdir``: exactly one of two runs that try at
  once succeeds, on a local filesystem as on NFS), then writing its owner file.
- ``tasks/<run>.<role>-<index>``: each task's liveness, rewritten every ``lease / 12`` seconds by that task only
  (``state`` active or released; ``done`` once the training finished). A run has ended when every task file of it
  says released, or none has changed for the lease, as the waiting run's own clock measures it (clocks of other
  machines are never compared).

Pure Python (no TensorFlow), so that tests and tools can use it alone.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("kubetf_trainer")

DIRECTORY = ".kubetf-fence"
LEASE_SECONDS = 120.0  # above NFS's default attribute cache times (acdirmax 60 s): a live run is never judged silent
BEATS_PER_LEASE = 12
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

Notify = Callable[..., Any]


class Superseded(Exception):
    """Another run took the directory while this one held it (it found this run silent for the lease): this run
    must not write again."""

    def __init__(self, holder: dict[str, Any]):
        super().__init__(f"run {holder.get('run')} of job {holder.get('job')} holds the checkpoint directory now")
        self.holder = holder


class Finished(Exception):
    """The run that held the directory while this one waited finished the training: nothing is left to do."""

    def __init__(self, holder: dict[str, Any]):
        super().__init__(f"run {holder.get('run')} of job {holder.get('job')} finished the training")
        self.holder = holder


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: str, data: dict[str, Any]) -> None:
    """Whole or not at all: readers never see half a file."""
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class Fence:
    """This task's part in holding ``root`` for its run. ``acquire`` before the first write (it waits while another
    run holds the directory), ``check`` before every write after it, ``release`` when the task ends."""

    def __init__(
        self,
        root: str,
        run: str,
        task: str,
        *,
        job: str = "",
        lease: float = LEASE_SECONDS,
        notify: Notify | None = None,
    ):
        self.root, self.run, self.task, self.job = root, run, task, job
        self.lease = lease
        self.beat = lease / BEATS_PER_LEASE
        self.notify: Notify = notify or (lambda kind, **fields: None)
        base = os.path.join(root, DIRECTORY)
        self.claims, self.tasks = os.path.join(base, "claims"), os.path.join(base, "tasks")
        self.task_file = os.path.join(self.tasks, f"{_SAFE.sub('_', run)}.{_SAFE.sub('_', task)}")
        self.held = False
        self.generation = 0  # of the claim this run holds the directory by
        self._beats = 0
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None
        self._lock = threading.Lock()  # the task file: the heartbeat thread and release write it
        self._released = False

    # ------------------------------------------------------------------ holding

    def acquire(self) -> None:
        """Return once this run holds the directory. Waits while another run holds it and lives; takes it over once
        that run has ended. Raises Finished when the run it waited for finished the training meanwhile."""
        if self.held:
            return
        os.makedirs(self.claims, exist_ok=True)
        os.makedirs(self.tasks, exist_ok=True)
        self._start_heartbeat()  # alive from now on: a restarted task of the holding run is never taken for gone
        seen: dict[Any, tuple[str, float]] = {}
        waited = False
        while True:
            generation, owner = self.holder()
            run = (owner or {}).get("run")
            if run == self.run:
                self.held, self.generation = True, generation
                return
            why = self._free(generation, owner, seen)
            if why is not None:
                if waited and why == "done":
                    assert owner is not None
                    raise Finished(owner)
                if self._take(generation + 1):
                    self.held, self.generation = True, generation + 1
                    self._took(generation + 1, None if why == "free" else owner or {}, why)
                    return
                continue  # another run took it first
            if not waited:
                waited = True
                self.notify("fence", state="waiting", run=self.run, holder=owner)
                log.warning(
                    "kubetf_trainer: checkpoint directory %s is held by run %s of job %s (since %s, on %s): this "
                    "run (%s) waits, without training, until that run has ended",
                    self.root, (owner or {}).get("run"), (owner or {}).get("job"), (owner or {}).get("since"),
                    (owner or {}).get("host"), self.run,
                )  # fmt: skip
            time.sleep(self.beat)

    def _took(self, generation: int, before: dict[str, Any] | None, why: str) -> None:
        """Said only when another run held the directory before (a free one is the common case: nothing to say)."""
        if before is None:
            return
        self.notify("fence", state="held", run=self.run, generation=generation, before=before, why=why)
        how = {"silent": f"silent for {self.lease:.0f} s", "done": "finished"}.get(why, why)
        log.warning(
            "kubetf_trainer: this run (%s) took checkpoint directory %s over from run %s of job %s (%s)",
            self.run, self.root, before.get("run"), before.get("job"), how,
        )  # fmt: skip

    def check(self) -> None:
        """Before a write: raises Superseded when another run took the directory since (a newer generation)."""
        self.acquire()
        generation, owner = self.holder()
        if generation == self.generation:
            return  # still this run's claim (its owner file is this run's: a failed read of it changes nothing)
        if (owner or {}).get("run") == self.run:  # another task of this run took it again after a silence
            self.generation = generation
            return
        self.held = False
        raise Superseded(owner or {})

    def holder(self) -> tuple[int, dict[str, Any] | None]:
        """The highest generation and its owner (None while being named, or unreadable); (0, None): never taken."""
        try:
            names = os.listdir(self.claims)
        except FileNotFoundError:
            return 0, None
        generations = sorted((int(n) for n in names if n.isdigit()), reverse=True)
        if not generations:
            return 0, None
        return generations[0], _read(os.path.join(self.claims, f"{generations[0]:08d}", "owner"))

    def _take(self, generation: int) -> bool:
        path = os.path.join(self.claims, f"{generation:08d}")
        try:
            os.mkdir(path)
        except FileExistsError:
            return False
        owner = {"run": self.run, "job": self.job, "task": self.task, "host": socket.gethostname(), "since": _now()}
        _write(os.path.join(path, "owner"), owner)
        for old in os.listdir(self.claims):  # keep the one before, for whoever reads it now
            if old.isdigit() and int(old) < generation - 1:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.claims, old, "owner"))
                    os.rmdir(os.path.join(self.claims, old))
        return True

    # ------------------------------------------------------------------ liveness

    def _free(self, generation: int, owner: dict[str, Any] | None, seen: dict[Any, tuple[str, float]]) -> str | None:
        """Why the directory may be taken now ("free", or how its holder ended: `_ended`), None while held."""
        if generation == 0:
            return "free"
        if owner is None:  # a run died between taking the generation and naming itself
            return "silent" if self._silent(seen, ("claim", generation), None) else None
        return self._ended(str(owner.get("run")), seen)

    def _ended(self, run: str, seen: dict[Any, tuple[str, float]]) -> str | None:
        """How every task of `run` has ended: "done" (released, the training finished), "released", "silent" (some
        said nothing for the lease); None while one lives."""
        files = glob.glob(os.path.join(self.tasks, f"{glob.escape(_SAFE.sub('_', run))}.*"))
        files = [f for f in files if not f.endswith(".tmp")]
        if not files:
            return "silent" if self._silent(seen, ("no task", run), None) else None
        how = {"released"}
        for path in files:
            data = _read(path)
            if data is not None and data.get("state") == "released":
                how.add("done" if data.get("done") else "released")
            elif self._silent(seen, path, data):
                how.add("silent")
            else:
                return None
        return "silent" if "silent" in how else "done" if "done" in how else "released"

    def _silent(self, seen: dict[Any, tuple[str, float]], key: Any, data: dict[str, Any] | None) -> bool:
        """Whether what `key` names has not changed for the lease, by this process's clock."""
        now = time.monotonic()
        content = json.dumps(data, sort_keys=True)
        if key not in seen or seen[key][0] != content:
            seen[key] = (content, now)
        return now - seen[key][1] >= self.lease

    def _start_heartbeat(self) -> None:
        if self._heart is not None:
            return
        self._beat()
        self._heart = threading.Thread(target=self._heartbeat, name="kubetf-fence", daemon=True)
        self._heart.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.beat):
            try:
                self._beat()
            except OSError as error:  # the storage is away: the next beat tries again
                log.warning("kubetf_trainer: could not write %s: %s", self.task_file, error)

    def _beat(self, state: str = "active", done: bool = False) -> None:
        with self._lock:
            if self._released:
                return
            self._beats += 1
            _write(
                self.task_file,
                {"run": self.run, "job": self.job, "task": self.task, "state": state, "done": done,
                 "beat": self._beats, "host": socket.gethostname(), "pid": os.getpid(), "at": _now()},
            )  # fmt: skip
            self._released = state == "released"

    def release(self, done: bool = False) -> None:
        """This task ends: no write of it follows. `done`: the training finished."""
        if self._heart is None:
            return
        self._stop.set()
        try:
            self._beat("released", done)
        except OSError as error:
            log.warning("kubetf_trainer: could not release %s: %s", self.task_file, error)


# ---------------------------------------------------------------------- this process's fence

# What a task exits with when another run took the directory from it: kubetf counts 42 as a disruption (never
# against backoffLimit) and starts the task again, which then waits in `claim` while the other run holds it.
SUPERSEDED_EXIT_CODE = 42
_fence: Fence | None = None
_made = False


def current(environ: dict[str, str] | None = None) -> Fence | None:
    """This process's fence: None without a run identity (``KUBETF_RUN_ID``: outside a TrainingJob's pods, e.g.
    ``kubetf local``) or without a checkpoint volume (``KUBETF_CHECKPOINT_DIR``), where nothing is fenced."""
    global _fence, _made
    if _made:
        return _fence
    from .env import task_info
    from .progress import emit

    env = os.environ if environ is None else environ
    info = task_info(dict(env))
    run = env.get("KUBETF_RUN_ID") or ""
    _made = True
    if run and info.checkpoint_root:
        lease = float(env.get("KUBETF_CHECKPOINT_LEASE_SECONDS") or LEASE_SECONDS)
        _fence = Fence(
            info.checkpoint_root, run, f"{info.role}-{info.index}", job=info.job_name, lease=lease,
            notify=lambda kind, **fields: emit(kind, info, **fields),
        )  # fmt: skip
        import atexit

        atexit.register(_fence.release)
    return _fence


def claim() -> None:
    """Before this task's first write to the checkpoint directory: wait while another run of the job holds it.
    Exits 0 when the run it waited for finished the training (nothing is left to do)."""
    fence = current()
    if fence is None:
        return
    try:
        fence.acquire()
    except Finished as finished:
        log.warning("kubetf_trainer: %s while this run (%s) waited: nothing left to do, exiting 0", finished, fence.run)
        _leave(fence, 0, "finished elsewhere", finished.holder, done=True)


def check() -> None:
    """Before each write to the checkpoint directory: exits 42 (a disruption) when another run took it over."""
    fence = current()
    if fence is None:
        return
    try:
        fence.check()
    except Superseded as superseded:
        log.error(
            "kubetf_trainer: %s: it found this run (%s) silent for %.0f s and took it over; this run writes nothing "
            "more and exits %d (a disruption: started again, it waits until that run has ended)",
            superseded, fence.run, fence.lease, SUPERSEDED_EXIT_CODE,
        )  # fmt: skip
        _leave(fence, SUPERSEDED_EXIT_CODE, "superseded", superseded.holder)


def release(done: bool = False) -> None:
    """This task writes nothing more (`done`: the training finished): a run waiting for the directory may take it."""
    if _fence is not None:
        _fence.release(done)


def _leave(fence: Fence, code: int, state: str, holder: dict[str, Any], done: bool = False) -> None:
    from . import report

    fence.notify("fence", state=state, run=fence.run, holder=holder, exit_code=code)
    fence.release(done)
    report.flush(timeout=2.0, final=True)
    os._exit(code)  # before TensorFlow's teardown, which can wait on peers that wait too
