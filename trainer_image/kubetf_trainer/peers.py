"""A MultiWorkerMirrored task and its peers: the group trains only while all of them live, and it restarts as a whole
(kubetf restarts the group; in place, each task restarts in its pod as its program exits). So once one task is gone,
the sooner the others end, the sooner training resumes. Left to TensorFlow, a task whose peer died without a word
waited for it: its coordination service takes a task for dead after 10 s without a heartbeat (seen: the surviving
worker's collectives failed 8 s after its peer crashed), and the process then took 1-2 s more to end (TensorFlow's
native teardown, after Python's). What this module changes, for programs that make their strategy with
``make_strategy``:

- the coordination service's heartbeat timeout: ``KUBETF_HEARTBEAT_TIMEOUT`` seconds (3) instead of 10
  (``configure``);
- a task that fails with an exception tells the others at once (TensorFlow's ``report_error_to_cluster``, as its own
  ``PreemptionCheckpointHandler.run`` does), and any task that fails (its own error, or a peer's) ends without
  TensorFlow's native teardown: Python's exit handlers run, then the process exits 1 (``fail_fast``);
- a peer that restarted (in its pod, at once: a crash the kubelet restarts in place) is seen by the group's chief
  within a quarter of a second: each task's process writes a token of its own under ``.kubetf/started/`` on the
  checkpoint volume when Python starts (``announce``, from the image's ``sitecustomize``), and the chief watches the
  others' tokens (``watch``); a new token ends the group, as the restarted peer's first words to it would, seconds
  later (it says them after its TensorFlow import).

Standard library only at import (``announce`` runs at interpreter start).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .env import TaskInfo, task_info

log = logging.getLogger("kubetf_trainer")

ENV_HEARTBEAT_TIMEOUT = "KUBETF_HEARTBEAT_TIMEOUT"
HEARTBEAT_TIMEOUT = 3.0
WATCH_SECONDS = 0.25
FAILED = 1  # what Python exits with on an unhandled exception
STARTED = os.path.join(".kubetf", "started")


def heartbeat_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds without a heartbeat after which the coordination service takes a task for dead."""
    value = (os.environ if environ is None else environ).get(ENV_HEARTBEAT_TIMEOUT, "")
    with contextlib.suppress(ValueError):
        if float(value) > 0:
            return float(value)
    return HEARTBEAT_TIMEOUT


def configure(tf: Any, info: TaskInfo) -> None:
    """Before the strategy: its coordination service as TensorFlow configures it, with our heartbeat timeout. The
    heartbeats come from a C++ thread, which a busy interpreter does not hold up. A service already configured is
    kept (the strategy does the same)."""
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context

        if context.context().coordination_service is not None or info.role not in ("chief", "worker"):
            return
        spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
        jobs = [
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in spec.jobs
        ]
        context.context().configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(spec),
            coordinated_jobs=jobs,
            heartbeat_timeout_in_ms=int(heartbeat_timeout() * 1000),
        )
    except Exception as exc:  # TensorFlow's internals moved: its own configuration, its 10 s
        log.warning("kubetf_trainer: the coordination service keeps its defaults (%s: %s)", type(exc).__name__, exc)


# -- failing fast ----------------------------------------------------------------------------------------------------


def fail_fast(tell_peers: bool) -> None:
    """From now on an unhandled exception prints its traceback, tells the peers (``tell_peers``), runs Python's exit
    handlers, and ends the process with exit code 1, skipping TensorFlow's native teardown."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        if issubclass(kind, KeyboardInterrupt):
            return
        if tell_peers:
            _tell_peers(f"{type(value).__name__}: {str(value).splitlines()[0][:300] if str(value) else ''}")
        end(FAILED)

    sys.excepthook = hook


def _tell_peers(message: str, timeout: float = 0.5) -> None:
    """Put the group in error (each peer's collectives fail with `message`), at most `timeout` seconds: the service
    may be on a task that is gone."""

    def report() -> None:
        with contextlib.suppress(Exception):
            from tensorflow.python.eager import context
            from tensorflow.python.framework import errors

            context.context().report_error_to_cluster(errors.UNAVAILABLE, message)

    thread = threading.Thread(target=report, name="kubetf-tell-peers", daemon=True)
    thread.start()
    thread.join(timeout)


def end(code: int) -> None:
    """Exit now, as Python would but for TensorFlow's native teardown: Python's exit handlers (the last progress
    report, logging, the program's own), the streams flushed, then ``os._exit``."""
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # what Python's own exit runs first; os._exit would skip it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# -- peers restarted ------------------------------------------------------------------------------------------------


def _started_dir(root: str) -> str:
    return os.path.join(root, STARTED)


def announce(environ: Mapping[str, str] | None = None) -> str | None:
    """At interpreter start, in a MultiWorkerMirrored chief or worker with a checkpoint volume: write this process's
    token (`.kubetf/started/ROLE-INDEX`); returns it. Any failure leaves the program alone."""
    env = os.environ if environ is None else environ
    try:
        info = task_info(dict(env))
        if info.strategy != "MultiWorkerMirrored" or info.role not in ("chief", "worker") or not info.checkpoint_root:
            return None
        token = f"{uuid.uuid4().hex} {os.getpid()} {time.time():.3f}\n"
        directory = _started_dir(info.checkpoint_root)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{info.role}-{info.index}")
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w") as out:
            out.write(token)
        os.replace(tmp, path)
        return token
    except Exception:
        return None


def _tokens(info: TaskInfo) -> dict[str, str]:
    directory = _started_dir(info.checkpoint_dir)
    found = {}
    for role in ("chief", "worker"):
        for index in range(len(info.cluster.get(role, []))):
            task = f"{role}-{index}"
            if task == f"{info.role}-{info.index}":
                continue
            with contextlib.suppress(OSError), open(os.path.join(directory, task)) as f:
                found[task] = f.read()
    return found


def watch(info: TaskInfo, on_restart: Callable[[str], None] | None = None, every: float = WATCH_SECONDS) -> bool:
    """On the group's chief, once the group formed: a thread that ends the group when a peer's token changes (that
    peer restarted: this group can never step again). Returns whether it watches."""
    if not info.is_chief or info.num_workers < 2:
        return False
    known = _tokens(info)
    if not known:  # no shared volume (each task its own temporary directory), or tokens not written: nothing to see
        return False

    def restarted(task: str) -> None:
        message = f"{task} restarted: the group ends, to restart as a whole"
        print(f"kubetf_trainer: {message}", file=sys.stderr, flush=True)
        _tell_peers(message)  # the peers' collectives fail now, and so do this task's
        time.sleep(5.0)  # the main thread's error ends the process (fail_fast); if it does not, this does
        end(FAILED)

    def loop() -> None:
        while True:
            time.sleep(every)
            now = _tokens(info)
            changed = sorted(t for t, token in now.items() if known.get(t) not in (None, token))
            if changed:
                (on_restart or restarted)(changed[0])
                return

    threading.Thread(target=loop, name="kubetf-peers", daemon=True).start()
    return True
