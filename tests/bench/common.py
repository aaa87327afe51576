"""What the benchmarks share: percentiles, a process's RSS and CPU time, a watch counting each job's children, the
cluster lock, a client pool for parallel requests."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from kubernetes import client, config

CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _status_kib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return float("nan")


def rss_mib(pid: int) -> float:
    return _status_kib(pid, "VmRSS") / 1024


def peak_rss_mib(pid: int) -> float:
    """The process's high-water mark of RSS since it started."""
    return _status_kib(pid, "VmHWM") / 1024


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), from /proc/<pid>/stat."""
    return _cpu_of(Path(f"/proc/{pid}/stat").read_text())


def _cpu_of(stat: str) -> float:
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": fields[0] is the state (field 3)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process on this machine: its name (comm) and CPU seconds so far (utime + stime, from /proc)."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        found[int(entry.name)] = (stat[stat.index("(") + 1 : stat.rindex(")")], _cpu_of(stat))
    return found


def machine_cpu(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float, names: dict[int, str],
    top: int = 8,
) -> str:  # fmt: skip
    """Who used this machine's CPU between two `cpu_by_process` reads `seconds` apart, in cores: the busiest
    processes by name (`names` names some by pid: the operator, the benchmark, both "python"). A pid whose name
    changed was reused: counted from 0, as one that started meanwhile. What ended meanwhile is not counted."""
    used: Counter[str] = Counter()
    for pid, (name, spent) in after.items():
        earlier = before.get(pid)
        used[names.get(pid, name)] += spent - (earlier[1] if earlier is not None and earlier[0] == name else 0.0)
    busiest = ", ".join(f"{name} {spent / seconds:.2f}" for name, spent in used.most_common(top))
    return f"{sum(used.values()) / seconds:.2f} of {os.cpu_count()} cores busy over {seconds:.0f}s: {busiest}"


def settle(pid: int, quiet: float = 2.0, least: float = 3.0, most: float = 60.0, share: float = 0.02) -> float:
    """Wait until the process has used under `share` of a CPU for `quiet` seconds (at least `least`, at most `most`
    seconds in all); return the seconds waited."""
    start = time.monotonic()
    time.sleep(least)
    last = cpu_seconds(pid)
    while time.monotonic() - start < most:
        time.sleep(quiet)
        now = cpu_seconds(pid)
        if now - last < share * quiet:
            break
        last = now
    return time.monotonic() - start


def api_client(kubeconfig: str, pool: int = 64) -> client.ApiClient:
    """An API client whose connection pool lets `pool` threads send requests at once."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


@contextlib.contextmanager
def cluster_lock(path: str | None) -> Iterator[None]:
    """The lock every user of the shared test cluster takes (`flock /tmp/kubetf-cluster.lock ...`)."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        start = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.monotonic() - start
        if waited > 1:
            print(f"  (waited {waited:.0f}s for {path})", flush=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ChildWatch:
    """Counts the live children (pods, and services when asked) of each job in a namespace from one watch per
    kind, so that waiting costs no polling. Events are parsed as plain JSON (the client's models are slow).

    `live[job]` is the set of (kind, name) of children not being deleted; `attempts[pod]` the pod's
    `kubetf.io/attempt` label."""

    def __init__(
        self, api: client.ApiClient, namespace: str, job_label: str, kinds: tuple[str, ...] = ("pods",)
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.job_label = namespace, job_label
        self.live: dict[str, set[tuple[str, str]]] = {}
        self.attempts: dict[str, str | None] = {}
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        for kind in kinds:
            lister = {"pods": self.core.list_namespaced_pod, "services": self.core.list_namespaced_service}[kind]
            # Listing first gives the resourceVersion to watch from: nothing created after this is missed.
            listed = json.loads(lister(namespace, _preload_content=False).data)
            for item in listed["items"]:
                self._apply(kind, "ADDED", item)
            rv = listed["metadata"]["resourceVersion"]
            threading.Thread(target=self._run, args=(kind, lister, rv), daemon=True).start()

    def count(self, job: str) -> int:
        return len(self.live.get(job, ()))

    def _apply(self, kind: str, type_: str, obj: dict) -> None:
        meta = obj["metadata"]
        job = (meta.get("labels") or {}).get(self.job_label)
        if job is None:
            return
        children = self.live.setdefault(job, set())
        if type_ == "DELETED" or meta.get("deletionTimestamp"):
            children.discard((kind, meta["name"]))
        else:
            children.add((kind, meta["name"]))
            if kind == "pods":
                self.attempts[meta["name"]] = meta["labels"].get("kubetf.io/attempt")

    def _run(self, kind: str, lister: Callable, rv: str) -> None:
        try:
            while True:
                response = lister(
                    self.namespace,
                    watch=True,
                    resource_version=rv,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                    _preload_content=False,
                )
                buffer = b""
                for chunk in response.stream(65536):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise RuntimeError(f"watch of {kind} failed: {event['object']}")
                        rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] == "BOOKMARK":
                            continue
                        with self.cond:
                            self._apply(kind, event["type"], event["object"])
                            self.cond.notify_all()
        except BaseException as error:  # reported to the waiter
            with self.cond:
                self.error = error
                self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float = 60, what: str = "benchmark condition") -> float:
        """Block until predicate() holds; return time.monotonic() at that moment."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                if self.error:
                    raise RuntimeError(f"watch failed: {self.error}") from self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} not reached in {timeout:.0f}s")
                self.cond.wait(left)
        return time.monotonic()
