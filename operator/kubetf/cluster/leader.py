"""Leader election on a coordination.k8s.io Lease, the protocol of client-go's leaderelection package.

The official Python client ships only a ConfigMap lock; this is the Lease one. The holder renews the lease every
`retry_period`. A candidate takes it over only once the holder's record has not changed for `lease_duration`,
measured on the candidate's own clock from when it last saw the record change (so clock skew between machines
does not matter). The holder stops writing as soon as it has not renewed for `renew_deadline`, which is shorter
than `lease_duration`: by the time anyone else may act, the old holder has stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from kubetf.cluster import metrics
from kubetf.cluster.kube import Kube
from kubetf.core.config import OperatorConfig

log = logging.getLogger("kubetf.cluster.leader")


def _micro_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, kube: Kube, config: OperatorConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.config, self.clock = kube, config, clock
        self.identity = config.identity
        self.renewed_at: float | None = None  # our clock, last successful acquire or renew
        self.observed: tuple[Any, ...] | None = None  # the holder's record as last seen
        self.observed_at = 0.0
        self.stopping = threading.Event()
        self.elected = threading.Event()
        # Set after the first round that reached the API server (the lease read, and taken or seen held): from then
        # on this operator is a candidate that can take over (its readiness: a rolling upgrade must not count a pod
        # still importing Python as a standby).
        self.candidate = threading.Event()
        self.heartbeat = clock()  # the loop's last round, for /healthz
        self.thread: threading.Thread | None = None
        self.on_change: Callable[[bool], None] = lambda held: None  # the lease lost (False) or held again (True)

    # ------------------------------------------------------------------ state

    def is_leader(self) -> bool:
        """True while writes are safe: the lease was renewed less than renew_deadline ago."""
        return self.renewed_at is not None and self.clock() - self.renewed_at < self.config.renew_deadline

    def alive(self) -> bool:
        return self.clock() - self.heartbeat < max(10 * self.config.retry_period, 30.0)

    # ------------------------------------------------------------------ loop

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="kubetf-leader-election", daemon=True)
        self.thread.start()

    def run(self) -> None:
        """Try to acquire, then renew, every retry_period until `stop`; `on_change` each time the lease is won or lost.

        A leader that cannot renew (the API server unreachable, or the lease taken) stops writing at once:
        `is_leader` turns False, which `Kube` checks before every write. It keeps trying, and resumes when it
        holds the lease again, so an API server restart costs no operator restart."""
        leading = False
        while not self.stopping.is_set():
            self.heartbeat = self.clock()
            try:
                held = self.try_acquire_or_renew()
            except Exception as error:  # an unreachable API server: the renew deadline decides
                log.warning("leader election: %s", error)
                held = False
            if held and not leading:
                leading = True
                log.info("became the leader (lease %s/%s)", self.config.lease_namespace, self.config.lease_name)
                metrics.LEADER.set(1)
                self.elected.set()
                self.on_change(True)
            elif leading and not self.is_leader():
                leading = False
                log.error("lost the leader lease: no writes until it is held again")
                metrics.LEADER.set(0)
                self.on_change(False)
            self.stopping.wait(self.config.retry_period)

    def stop(self, release: bool = True) -> None:
        """Stop the loop; a holder gives the lease up at once, so a standby need not wait for it to expire."""
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=self.config.renew_deadline)  # no renewal may follow the release
        if release and self.is_leader():
            self.renewed_at = None
            try:
                lease = self.kube.get_lease(self.config.lease_namespace, self.config.lease_name)
                if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    lease["spec"]["holderIdentity"] = None
                    lease["spec"]["leaseDurationSeconds"] = 1
                    self.kube.replace_lease(self.config.lease_namespace, self.config.lease_name, lease)
                    log.info("released the leader lease")
            except Exception as error:
                log.warning("could not release the leader lease (it expires by itself): %s", error)

    def try_acquire_or_renew(self) -> bool:
        """One round: the lease read, then taken, renewed or left to its holder. Raises what the API server said."""
        held = self._acquire_or_renew()
        self.candidate.set()
        return held

    def _acquire_or_renew(self) -> bool:
        config = self.config
        now, wall = self.clock(), time.time()
        lease = self.kube.get_lease(config.lease_namespace, config.lease_name)
        spec_new = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(config.lease_duration),
            "renewTime": _micro_time(wall),
        }
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": config.lease_name, "namespace": config.lease_namespace},
                "spec": {**spec_new, "acquireTime": _micro_time(wall), "leaseTransitions": 0},
            }
            try:
                self.kube.create_lease(config.lease_namespace, body)
            except ApiException as error:
                if error.status == 409:
                    return False  # another candidate created it first
                if error.status == 404:
                    raise RuntimeError(
                        f"namespace {config.lease_namespace} does not exist: create it, or pass --lease-namespace"
                    ) from error
                raise
            self.renewed_at = now
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self.observed:
            self.observed, self.observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or config.lease_duration)
        if holder and holder != self.identity and now < self.observed_at + duration:
            return False  # held by someone else whose lease has not expired
        if holder == self.identity:
            spec_new["acquireTime"] = spec.get("acquireTime") or _micro_time(wall)
            spec_new["leaseTransitions"] = spec.get("leaseTransitions") or 0
        else:
            spec_new["acquireTime"] = _micro_time(wall)
            spec_new["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**spec, **spec_new}
        try:
            self.kube.replace_lease(config.lease_namespace, config.lease_name, lease)
        except ApiException as error:
            if error.status == 409:
                return False  # written meanwhile (a renewal or a competing candidate): look again next round
            raise
        self.renewed_at = now
        self.observed, self.observed_at = (self.identity, spec_new["renewTime"], spec_new["leaseDurationSeconds"]), now
        return True
