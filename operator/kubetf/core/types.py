"""The values every layer passes around, at the bottom of the house: it imports nothing of kubetf.

Kubernetes objects are plain dicts, in the shape the API server sends them. What the operator makes beside pods
(a gang's PodGroups, a Workload) is written through one generic path (`Write`), and is the job's own only by its
controller reference (`owned_by`): never by a name or a label, which anyone can copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

Obj = dict[str, Any]
Pod = Obj
Job = Obj


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    # The version of the job the decision that says it was made on (its resourceVersion; `decided_on`): the same
    # event decided again on the same version (a retry) is the same Event object; decided again later, a new one.
    basis: str = ""

    def decided_on(self, job: Obj) -> Event:
        """This event, of a decision made on `job` as it was read (an event that has its basis keeps it)."""
        if self.basis:
            return self
        return Event(self.type, self.reason, self.message, str((job.get("metadata") or {}).get("resourceVersion")))

    def name(self, job: Obj) -> str:
        """The Event object's name: the same for the same event of the same job (its uid) decided on the same version
        of it (`basis`), so a post made again (a retry, another operator after a crash) is the one already there, and
        one that happens again (a second suspension) is an Event of its own."""
        said = f"{(job.get('metadata') or {}).get('uid')}|{self.basis}|{self.type}|{self.reason}|{self.message}"
        return f"{(job.get('metadata') or {}).get('name')}.{hashlib.sha1(said.encode()).hexdigest()[:16]}"

    def as_status(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Resource:
    """A kind of object a scheduler integration makes for a job (kubetf.core.scheduling): how the adapter reaches
    it, and what of it the cache keeps (`slim`: the fields the decisions read)."""

    group: str
    version: str
    plural: str
    kind: str
    slim: Callable[[Obj], Obj] = field(compare=False, hash=False, repr=False)
    # A change of one may start or stop the job's pods (an admission, an eviction): its job is reconciled first.
    urgent: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def holds(self, obj: Obj) -> bool:
        return obj.get("apiVersion") == self.api_version and obj.get("kind") == self.kind


@dataclass(frozen=True)
class Write:
    """One write of an object a job owns, other than its pods (kubetf.cluster.kube.Kube.write carries it out; the
    objects a job creates are creates of the plan's, not writes):

    - `patch` / `status`: a merge patch of the object or of its status subresource, against the resourceVersion read
      (the object's, then each earlier write's answer): a write never lands on a newer version;
    - `unfinalize`: `finalizer` removed (a JSON patch testing the version read and the finalizer's place);
    - `delete`: that incarnation only (its uid as a precondition).
    """

    obj: Obj
    verb: str
    patch: Obj = field(default_factory=dict)
    finalizer: str = ""
    why: str = ""  # for the operator's log

    def describe(self) -> str:
        meta = self.obj.get("metadata") or {}
        what = f"{self.obj.get('kind')} {meta.get('name')}"
        return f"{what}: {self.verb}" + (f" ({self.why})" if self.why else "")


INVALID, DENIED, NAME_IN_USE, UNAVAILABLE = "Invalid", "Denied", "NameInUse", "Unavailable"


@dataclass(frozen=True)
class Refusal:
    """The API server would not create one of the job's objects, classified by the adapter from its answer
    (kubetf.core.refusals says what each means for the job)."""

    cause: str  # INVALID | DENIED | NAME_IN_USE | UNAVAILABLE
    kind: str  # Pod | Service | PersistentVolumeClaim | a scheduler integration's kind
    name: str
    message: str  # the API server's own words (for NAME_IN_USE: whose the object is)


def controller_of(obj: Obj) -> Obj | None:
    """The object's controller reference, or None."""
    owners = [o for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")]
    return owners[0] if owners else None


def owned_by(obj: Obj, uid: str | None) -> bool:
    """Provably the job's of that uid: its controller reference says so. Nothing else is ever touched."""
    owner = controller_of(obj)
    return bool(uid) and owner is not None and owner.get("uid") == uid


def uid_of(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")
