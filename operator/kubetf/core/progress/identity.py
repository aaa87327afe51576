"""Who may report a job's progress, and whose reports count: the identity rules of the progress endpoint.

A training pod reports with a projected service account token of audience `AUDIENCE`, bound to the pod (the
kubelet rotates it). The API server's TokenReview says which pod it is bound to, by name and uid; that pod must be
one the operator runs, owned by the job (its controller reference carries the job's uid), not being deleted. The
job a report is for is the pod's, whatever the body says. Of a job's tasks only the coordinator's reports are
training progress; the evaluator's are evaluation metrics.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from kubetf.core import api
from kubetf.core.status import pod_task

AUDIENCE = "kubetf.io/progress"  # the projected token's audience: good for this endpoint and nothing else
TOKEN_PATH = "/var/run/secrets/kubetf.io/progress"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
MAX_TOKEN = 8192  # bytes: a projected token is about 1 KiB; anything far longer is not one


@dataclass(frozen=True)
class Reporter:
    """The pod a token is bound to, from a TokenReview the API server answered authenticated."""

    namespace: str
    pod: str
    uid: str


@dataclass(frozen=True)
class Claims:
    """What a token says of itself before anyone checked it (the JWT's payload, read, not verified): enough to refuse
    at no cost a token that could never be accepted, never enough to accept one."""

    pod_uid: str
    expires: float


def claims(token: str, now: float) -> Claims | str:
    """The claims of a projected token that could be one of ours; else why it cannot (a string): not a JWT, another
    audience, expired, not bound to a pod."""
    if len(token) > MAX_TOKEN:
        return f"the token is {len(token)} bytes, at most {MAX_TOKEN}"
    parts = token.split(".")
    if len(parts) != 3:
        return "the token is not a JWT: send the projected service account token mounted in the pod"
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return "the token is not a JWT: its payload is not base64url JSON"
    if not isinstance(payload, dict):
        return "the token is not a JWT: its payload is not a JSON object"
    audience = payload.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if AUDIENCE not in audiences:
        return f"the token is not for audience {AUDIENCE}"
    expires = payload.get("exp")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool) or expires <= now:
        return "the token has expired: send the one the kubelet mounts now (it is read anew for each request)"
    bound = (payload.get("kubernetes.io") or {}) if isinstance(payload.get("kubernetes.io"), dict) else {}
    pod = bound.get("pod") if isinstance(bound.get("pod"), dict) else {}
    uid = pod.get("uid") if isinstance(pod, dict) else None
    if not isinstance(uid, str) or not uid:
        return "the token is not bound to a pod: mount a projected serviceAccountToken in the training pod"
    return Claims(uid, float(expires))


def reporter(review_status: dict[str, Any]) -> Reporter | None:
    """The pod a reviewed token was issued for; None when the token is not authenticated for `AUDIENCE`, or not
    bound to a pod (a service account's long-lived token would let any holder report for any job of its
    namespace)."""
    if not review_status.get("authenticated"):
        return None
    if AUDIENCE not in (review_status.get("audiences") or [AUDIENCE]):
        return None
    user = review_status.get("user") or {}
    parts = str(user.get("username") or "").split(":")
    extra = user.get("extra") or {}
    pod, uid = (extra.get(POD_NAME_EXTRA) or [None])[0], (extra.get(POD_UID_EXTRA) or [None])[0]
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"] or not pod or not uid:
        return None
    return Reporter(parts[2], pod, uid)


def task(reporter_: Reporter, pod: dict[str, Any] | None, job: dict[str, Any]) -> tuple[str, int] | str:
    """The task (role, index) the reporting pod runs for `job`; else why it is refused. `pod` is the operator's own
    record of the pod of that uid (None: it has none)."""
    meta = (pod or {}).get("metadata") or {}
    where = f"pod {reporter_.namespace}/{reporter_.pod}"
    if pod is None or meta.get("uid") != reporter_.uid or meta.get("name") != reporter_.pod:
        return f"{where} (uid {reporter_.uid}) is not a pod of a TrainingJob this operator runs"
    if meta.get("namespace") != reporter_.namespace or meta.get("deletionTimestamp"):
        return f"{where} is being deleted: its reports are not taken any more"
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    job_uid = (job.get("metadata") or {}).get("uid")
    if not owners or owners[0].get("uid") != job_uid:
        return f"{where} is not owned by TrainingJob {api.name(job)} (uid {job_uid})"
    found = pod_task(pod)
    if found is None or found[0] not in api.ROLES:
        return f"{where} carries no task of the job (labels {api.LABEL_ROLE}, {api.LABEL_INDEX})"
    return found[0], found[1]


def coordinator(job: dict[str, Any]) -> tuple[str, int]:
    """The task whose reports are the job's training progress: the chief, else worker 0."""
    chief = ((job.get("spec") or {}).get("replicaSpecs") or {}).get("chief") or {}
    return ("chief", 0) if chief.get("replicas", 0) > 0 else ("worker", 0)
