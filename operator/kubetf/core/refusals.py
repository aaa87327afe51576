"""Creates the API server refuses: what each refusal means for the job, and what it tells the user to do.

`cluster.kube` classifies the API server's answer into a `Refusal`; the decisions here turn it into the job's
status: INVALID (wrong as written) fails the job, naming the field to fix; DENIED (quota, admission, a webhook) and
NAME_IN_USE (a previous object of the same name) keep it waiting, with startupTimeoutSeconds counting from the
first refusal; UNAVAILABLE (the API server or a webhook it calls cannot answer now) is retried soon and costs the
job nothing. A new job is dry-run first (`trial`): nothing of it is created unless all of it would be. A pod whose
shape (`shape`: the pod as built, but for its job's name and uid) passed a dry run in the last seconds is not tried
again (`Admitted`): of a burst of jobs made from one template, the first is tried, not each, and the others'
Services are tried by creating them first (`service_first`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import OrderedDict
from typing import Any

from kubetf.core import api
from kubetf.core import status as st
from kubetf.core.api import Job
from kubetf.core.plan import Event, Plan
from kubetf.core.types import DENIED, INVALID, NAME_IN_USE, UNAVAILABLE, Refusal

__all__ = ["DENIED", "INVALID", "NAME_IN_USE", "UNAVAILABLE", "Refusal"]

REFUSED_SINCE = "createRejectedSince"  # status field: since when the job's creates have been refused
UNAVAILABLE_SINCE = "createUnavailableSince"  # status field: since when creates have met an unavailable API
WAITS = (REFUSED_SINCE, UNAVAILABLE_SINCE)
# Kubernetes' quantity grammar (resource.Quantity): what the API server cannot even decode as a Pod.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")


def trial(status: dict[str, Any], batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What to dry-run on the server before a Pending job creates anything (none of its tasks created: a new job,
    or one resumed, whose templates may have changed while it was suspended): the Service, the PVC and one pod per
    role. Pods of one role differ only in name, hostname, labels and env values, which the CRD already checked
    (names) or cannot be invalid (strings); the last index, the longest name, stands for its role. Empty for a
    restart: a request per role for nothing."""
    tasks = (status.get("tasks") or {}).values()
    objects = [o for batch in batches for o in batch]
    pods = [o for o in objects if o["kind"] == "Pod"]
    if not pods or status.get("phase") != st.PENDING or any(t.get("state") != st.WAITING for t in tasks):
        return []
    last = {pod["metadata"]["labels"][api.LABEL_ROLE]: pod for pod in pods}
    return [*(o for o in objects if o["kind"] != "Pod"), *last.values()]


def shape(obj: dict[str, Any], job: Job) -> str:
    """What admitting `obj` can depend on, equal for two jobs of one namespace that differ only in name and uid: the
    object with its job's name and uid masked. The namespace and the name's length stay in it (one tenant's admission
    never vouches for another's; a longer name makes longer derived names and label values). A NUL marks the masks:
    json.dumps escapes every NUL of the object itself, so nothing in it reads as a mask."""
    name, uid = api.name(job), job["metadata"]["uid"]
    text = json.dumps(obj, sort_keys=True).replace(uid, "\x00uid").replace(name, "\x00name")
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{job['metadata']['namespace']}/{len(name)}/{digest}"


class Admitted:
    """Pod shapes the API server admitted in a dry run within `seconds`, at most `most` (the oldest let go first).

    A pod of such a shape is admitted again unless the cluster changed meanwhile (a namespace's Pod Security level
    or LimitRange, a webhook's policy): then, for jobs created within `seconds` of the change, the real create says
    it (`record`), and what of the job was created with it stays. A quota refuses the pods the same either way (a
    trial asks for one pod per role: it never promised that a quota holds the whole job), but with no room left the
    job's Service is created before its pods are refused. Every other object (the Service, the PVC, a gang's) is
    always tried, a lone Service by creating it (`service_first`): its trial also says whose an existing one of its
    name is. Not thread-safe: the caller locks.
    """

    def __init__(self, seconds: float, most: int = 1024) -> None:
        self.seconds, self.most = seconds, most
        self.since: OrderedDict[str, float] = OrderedDict()

    def untried(self, trial: list[dict[str, Any]], job: Job, now: float) -> tuple[list[dict[str, Any]], list[str]]:
        """What of `trial` to dry-run (all but the pods of a shape admitted lately), and the shapes of its pods, for
        `remember` once they pass."""
        untried, shapes = [], []
        for obj in trial:
            key = shape(obj, job) if obj["kind"] == "Pod" else None
            if key is None or not self._recent(key, now):
                untried.append(obj)
                shapes += [key] if key is not None else []
        return untried, shapes

    def remember(self, shapes: list[str], now: float) -> None:
        """Pods of these shapes passed their dry run at `now`."""
        for key in shapes:
            self.since.pop(key, None)
            self.since[key] = now
        while len(self.since) > self.most:
            self.since.popitem(last=False)

    def _recent(self, key: str, now: float) -> bool:
        since = self.since.get(key)
        return since is not None and 0 <= now - since < self.seconds


def service_first(plan: Plan, untried: list[dict[str, Any]]) -> tuple[Plan, dict[str, Any] | None]:
    """When all that is left of a trial is the job's Service (its pods' shapes were admitted lately; a claim or a
    gang's objects are always tried), the Service is not dry-run: it is created, alone, before anything else (the
    plan's batches without it, and the Service to create first). A Service the API server refuses, or one of that
    name that is not the job's (whose it is, as the trial would ask: cluster.kube), stops the creates with nothing
    made; one it takes is the one the job needs anyway. One call where there were two; the round trip stays."""
    if len(untried) != 1 or untried[0]["kind"] != "Service":
        return plan, None
    service = untried[0]
    batches = [kept for batch in plan.batches if (kept := [o for o in batch if o is not service])]
    return dataclasses.replace(plan, batches=batches), service


def after_dry_run(plan: Plan, refusal: Refusal | None) -> Plan:
    """A refused trial creates nothing (`after_creates` then says why)."""
    return plan if refusal is None else dataclasses.replace(plan, batches=[], more_to_create=False)


def record(plan: Plan, before: dict[str, Any], refusal: Refusal, now: float) -> None:
    """What a refused create means for the plan's status (once the other creates are counted), with a Warning
    event when the condition changes from `before`."""
    job, status = plan.job, plan.status
    generation = job["metadata"].get("generation")
    if refusal.cause == INVALID:
        reason = "InvalidPodTemplate" if refusal.kind == "Pod" else "InvalidSpec"
        message = _invalid_message(job, refusal)
        st.set_phase(status, st.FAILED, reason, message, now, generation)
        status.setdefault("completionTime", st.format_time(now))
        for key in ("restartAfter", REFUSED_SINCE):
            status.pop(key, None)
        plan.events.append(Event("Warning", reason, message))
        return
    if refusal.cause == UNAVAILABLE:
        phase = st.RESTARTING if status.get("phase") == st.RESTARTING else st.PENDING
        phase = st.QUEUED if status.get("phase") == st.QUEUED else phase
        st.set_phase(status, phase, "CreateUnavailable", _unavailable_message(refusal), now, generation)
        status.setdefault(UNAVAILABLE_SINCE, st.format_time(now))
    else:
        phase = st.RESTARTING if status.get("phase") == st.RESTARTING else st.PENDING
        reason = refusal.cause if refusal.cause == NAME_IN_USE else "CreateRejected"
        st.set_phase(status, phase, reason, _waiting_message(job, refusal), now, generation)
        since = status.setdefault(REFUSED_SINCE, st.format_time(now))
        timeout = api.run_policy(job).get("startupTimeoutSeconds")
        plan.wake_at((st.parse_time(since) or now) + timeout if timeout else None)
    after = st.current_condition(status) or {}
    if [before.get(k) for k in ("type", "reason", "message")] != [after.get(k) for k in ("type", "reason", "message")]:
        plan.events.append(Event("Warning", after["reason"], after["message"]))


def create_timeout(job: Job, status: dict[str, Any], now: float) -> tuple[str | None, float | None]:
    """startupTimeoutSeconds also covers pods that could not even be created (refused since REFUSED_SINCE): the
    failure's message once it passed, else when it will."""
    timeout = api.run_policy(job).get("startupTimeoutSeconds")
    since = st.parse_time(status.get(REFUSED_SINCE))
    if not timeout or since is None:
        return None, None
    if now < since + timeout:
        return None, since + timeout
    why = (st.current_condition(status) or {}).get("message", "")
    return f"pods could not be created for startupTimeoutSeconds={timeout}: {why}", None


def _unavailable_message(refusal: Refusal) -> str:
    return (
        f"{refusal.kind} {refusal.name} could not be created: {refusal.message}. The API server, or an admission "
        "webhook it calls, is not answering; retrying until it does (this time does not count against "
        "startupTimeoutSeconds)"
    )


def _role_of(job: Job, pod_name_: str) -> str:
    return pod_name_[len(api.name(job)) + 1 :].rpartition("-")[0]


def _invalid_message(job: Job, refusal: Refusal) -> str:
    if refusal.kind != "Pod":
        where = "spec.checkpoint" if refusal.kind == "PersistentVolumeClaim" else "the job's spec"
        return (
            f"the API server refused {refusal.kind} {refusal.name}: {refusal.message}. "
            f"Fix {where}, then delete and re-apply the job"
        )
    role = _role_of(job, refusal.name)
    template = f"spec.replicaSpecs.{role}.template"
    fields = ""
    if "quantities" in refusal.message:  # a decoding error: the API server names no field, so find them
        pod_spec = (job["spec"]["replicaSpecs"].get(role) or {}).get("template", {}).get("spec") or {}
        bad = _bad_quantities(pod_spec, f"{template}.spec")
        fields = f" (invalid quantities: {', '.join(bad)})" if bad else ""
    return (
        f"replica {role}: the API server refused pod {refusal.name}: {refusal.message}{fields}. "
        f"Fix {template}, then delete and re-apply the job"
    )


def _bad_quantities(pod_spec: dict[str, Any], prefix: str) -> list[str]:
    bad = []
    for key in ("initContainers", "containers"):
        for i, container in enumerate(pod_spec.get(key) or []):
            resources = container.get("resources") or {}
            for kind in ("limits", "requests"):
                for resource, value in (resources.get(kind) or {}).items():
                    if not _QUANTITY.match(str(value)):
                        bad.append(f"{prefix}.{key}[{i}].resources.{kind}.{resource}={value!r}")
    return bad


_ADVICE = (
    ("exceeded quota", "free quota or raise the namespace's ResourceQuota"),
    ("PodSecurity", "make the template meet the namespace's Pod Security level"),
    ("admission webhook", "the webhook named above refused it: change the template or ask the cluster's admins"),
    ("denied request", "the admission policy named above refused it: change the template or ask the cluster's admins"),
)


def _waiting_message(job: Job, refusal: Refusal) -> str:
    timeout = api.run_policy(job).get("startupTimeoutSeconds")
    limit = f"; the job fails if its pods cannot be created within startupTimeoutSeconds={timeout}" if timeout else ""
    if refusal.cause == NAME_IN_USE:
        return f"waiting to create {refusal.kind} {refusal.name}: {refusal.message}; created once it is gone{limit}"
    if refusal.kind == "Pod":
        what = f"pod {refusal.name} (replica {_role_of(job, refusal.name)})"
    else:
        what = f"{refusal.kind} {refusal.name}"
    advice = next(
        (a for marker, a in _ADVICE if marker in refusal.message),
        "check the namespace's quotas, LimitRanges and admission policies",
    )
    return f"{what} could not be created: {refusal.message}. To fix: {advice}. Retrying with backoff{limit}"
