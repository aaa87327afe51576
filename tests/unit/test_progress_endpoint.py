"""The progress endpoint (kubetf.runtime.progress) against the fake API: who may report and what it costs to refuse
the rest, how reports reach the job's status through the job's own write (one writer), the write budget, the
training's health on the freshest report; the pods' token and URL (builders)."""

import base64
import json

import pytest
from prometheus_client import REGISTRY

from kubetf.core import builders
from kubetf.core.progress import identity, merge, protocol
from kubetf.core.progress.health import UNHEALTHY
from kubetf.runtime.progress.auth import Authenticator, Budget
from kubetf.runtime.progress.endpoint import ProgressEndpoint
from kubetf.runtime.server import Answer, Head, Slow

from .test_controller import T0, Shell, _ended, mwms

pytestmark = pytest.mark.unit

URL = "http://kubetf-progress.kubetf-system.svc:8090/v1/progress"


def jwt(claims: dict) -> str:
    """A token shaped like a projected service account token (the fake API server decides whether it is valid)."""

    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


def done(outcome):
    """What the server makes of `admit`'s or `accept`'s outcome: slow work run (on its pool)."""
    return outcome.work() if isinstance(outcome, Slow) else outcome


class Reporting:
    """A running MWMS job (`mnist`), a second one (`other`) and the endpoint of the leader, in fake time."""

    def __init__(self, budget=(50, 100), **config):
        self.shell = Shell(mwms(), progress_url=URL, **config).running()
        other = mwms()
        other["metadata"].update(name="other")
        self.shell.api.add_job(other)
        self.shell.api.deliver(self.shell.controller)
        self.shell.controller.reconcile(("team-a", "other"))
        self.shell.api.deliver(self.shell.controller)
        self.shell.queued()
        api = self.shell.api

        def read_progress(key, uid):
            job = api.get_job(*key)
            return (job.get("status") or {}).get("progress") if job and job["metadata"]["uid"] == uid else None

        self.endpoint = ProgressEndpoint(
            lambda token: api.review_token(token, identity.AUDIENCE),
            read_progress,
            Budget(*budget),
            clock=lambda: self.shell.now,
        )
        self.leader = True
        self.endpoint.lead(self.shell.controller.store, self.shell.controller.book, lambda: self.leader)

    @property
    def book(self):
        return self.shell.controller.book

    def token_of(self, pod_name: str, audience: str = identity.AUDIENCE, uid: str | None = None) -> str:
        pod = self.shell.api.pods[pod_name]
        uid = uid or pod["metadata"]["uid"]
        token = jwt(
            {"aud": [audience], "exp": self.shell.now + 3600, "kubernetes.io": {"pod": {"name": pod_name, "uid": uid}}}
        )
        self.shell.api.tokens[token] = ("team-a", "default", pod_name, uid)
        return token

    def post(self, token: str | None, body: dict | bytes, path: str = protocol.PATH) -> tuple[int, str | None]:
        """What the server does with a request: the head first, then the body."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"authorization": f"Bearer {token}"} if token else {}
        ticket = done(self.endpoint.admit(Head("POST", path, headers, len(raw))))
        answer = ticket if isinstance(ticket, Answer) else done(self.endpoint.accept(ticket, raw))
        return answer.status, answer.error

    def write(self) -> int:
        """The writer's turn: the jobs whose write is due are reconciled (and so write); how many."""
        keys = self.book.release()
        for key in keys:
            self.shell.api.deliver(self.shell.controller)
            self.shell.controller.reconcile(key)
        self.shell.api.deliver(self.shell.controller)
        return len(keys)

    def reconcile(self, job: str = "mnist"):
        self.shell.api.deliver(self.shell.controller)
        plan = self.shell.controller.reconcile(("team-a", job))
        self.shell.api.deliver(self.shell.controller)
        return plan

    def progress(self, job: str = "mnist") -> dict | None:
        return (self.shell.api.jobs[("team-a", job)].get("status") or {}).get("progress")

    def writes(self) -> int:
        return self.shell.api.calls.count("patch status")

    def reviews(self) -> int:
        return self.shell.api.calls.count("create TokenReview")

    def condition(self, type_: str = UNHEALTHY) -> dict | None:
        return next((c for c in self.shell.status().get("conditions") or [] if c["type"] == type_), None)


# ---------------------------------------------------------------------- who may report


def test_the_chiefs_report_becomes_the_jobs_progress_at_once_through_the_jobs_own_status_write():
    r = Reporting()
    assert r.post(r.token_of("mnist-chief-0"), {"epoch": 1, "epochs": 4, "metrics": {"loss": 0.5}}) == (204, None)
    assert r.progress() is None  # the endpoint writes nothing itself
    assert r.write() == 1
    progress = r.progress()
    assert (progress["epoch"], progress["epochs"], progress["summary"]) == (1, 4, "25%")
    assert progress["metrics"] == {"loss": 0.5}


def test_a_pod_reports_for_its_own_job_whatever_it_says():
    r = Reporting()
    body = {"epoch": 2, "epochs": 4, "job": "other"}  # an unknown field is refused: no way to name another job
    assert r.post(r.token_of("mnist-chief-0"), body)[0] == 400
    assert r.post(r.token_of("mnist-chief-0"), {"epoch": 2, "epochs": 4}) == (204, None)
    r.write()
    assert r.progress()["epoch"] == 2 and r.progress("other") is None


@pytest.mark.parametrize(
    "authorization",
    [
        None,  # no token
        "not-a-token",  # not a JWT
        jwt({"aud": ["https://kubernetes.default.svc"], "exp": T0 + 60}),  # made for the API server itself
        jwt({"aud": [identity.AUDIENCE], "exp": T0 - 1, "kubernetes.io": {"pod": {"uid": "x"}}}),  # expired
        jwt({"aud": [identity.AUDIENCE], "exp": T0 + 60}),  # bound to no pod (a service account's own token)
        jwt({"aud": [identity.AUDIENCE], "exp": T0 + 60, "kubernetes.io": {"pod": {"uid": "uid-of-jupyter"}}}),
    ],
)
def test_a_token_that_could_never_be_ours_is_refused_without_asking_the_api_server(authorization):
    r = Reporting()
    before = r.writes()
    status, error = r.post(authorization, {"epoch": 1})
    assert status in (401, 403) and error
    assert r.reviews() == 0  # refused on what it claims: junk costs no TokenReview
    assert r.write() == 0 and r.writes() == before and r.progress() is None


def test_a_forged_token_claiming_one_of_our_pods_is_reviewed_once_and_refused():
    r = Reporting()
    pod_uid = r.shell.api.pods["mnist-chief-0"]["metadata"]["uid"]
    forged = jwt({"aud": [identity.AUDIENCE], "exp": T0 + 60, "kubernetes.io": {"pod": {"uid": pod_uid}}})
    assert r.post(forged, {"epoch": 1})[0] == 401
    assert r.post(forged, {"epoch": 1})[0] == 401
    assert r.reviews() == 1  # the refusal is remembered: a stale token costs one review, not one per request


def test_new_tokens_past_the_endpoints_budget_are_told_to_retry_without_a_review():
    r = Reporting(budget=(1, 2))
    pod_uid = r.shell.api.pods["mnist-chief-0"]["metadata"]["uid"]
    answers = []
    for i in range(5):
        forged = jwt({"aud": [identity.AUDIENCE], "exp": T0 + 60 + i, "kubernetes.io": {"pod": {"uid": pod_uid}}})
        answers.append(r.post(forged, {"epoch": 1})[0])
    assert answers == [401, 401, 429, 429, 429] and r.reviews() == 2


def test_a_pod_named_like_one_of_the_jobs_but_not_owned_by_it_is_refused():
    r = Reporting()
    api = r.shell.api
    chief = api.pods.pop("mnist-worker-1")  # the job's own pod is gone ...
    impostor = {**chief, "metadata": {**chief["metadata"], "uid": "uid-of-an-impostor", "ownerReferences": []}}
    api.pods["mnist-worker-1"] = impostor  # ... and another of that name and labels takes its place, not owned by it
    api.update_pod("mnist-worker-1")
    api.deliver(r.shell.controller)
    status, error = r.post(r.token_of("mnist-worker-1"), {"epoch": 1})
    assert status == 403 and "not owned by TrainingJob mnist" in error


def test_a_pod_of_another_job_reports_for_its_own_job_only():
    r = Reporting()
    assert r.post(r.token_of("other-chief-0"), {"epoch": 3, "epochs": 4}) == (204, None)
    r.write()
    assert r.progress() is None and r.progress("other")["epoch"] == 3


def test_an_oversized_or_malformed_report_is_refused_with_its_reason_and_nothing_is_written():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    status, error = r.post(token, {"epoch": 1, "metrics": {"loss": "lots"}})
    assert status == 400 and error.startswith("metrics.loss")
    assert r.post(token, {"epoch": 1}, path="/v1/other")[0] == 404
    assert r.write() == 0 and r.progress() is None


def test_a_standby_says_retry_before_it_looks_at_the_token():
    r = Reporting()
    r.leader = False
    assert r.post(r.token_of("mnist-chief-0"), {"epoch": 1})[0] == 503
    assert r.reviews() == 0


def test_a_workers_report_changes_nothing_and_the_token_is_reviewed_once():
    r = Reporting()
    token = r.token_of("mnist-worker-1")
    assert r.post(token, {"epoch": 1}) == (204, None)
    assert r.post(token, {"epoch": 2}) == (204, None)
    assert r.reviews() == 1
    r.write()
    assert not (r.progress() or {}).get("epoch")  # only the chief (else worker 0) speaks for the training


# ---------------------------------------------------------------------- the writes: the job's own, within a budget


def test_writes_are_coalesced_per_job_and_the_final_report_goes_at_once():
    r = Reporting(progress_write_seconds=30)
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 10, "steps": 100})
    assert r.write() == 1
    for step in range(20, 80, 10):  # a report a second: one write 30 s after the first
        r.shell.now += 1
        r.post(token, {"step": step, "steps": 100})
        assert r.write() == 0
    r.shell.now = T0 + 30
    assert r.write() == 1 and r.progress()["step"] == 70
    r.shell.now += 1
    r.post(token, {"step": 100, "steps": 100, "final": True})
    assert r.write() == 1 and r.progress()["summary"] == "100%"


def test_the_status_write_that_says_the_job_ended_carries_its_last_report():
    # CI run 42: the chief's final report was accepted, its pod exited, and the job read Succeeded at 90% until the
    # progress writer's turn came. The job's own write carries what is held.
    r = Reporting(progress_write_seconds=30)
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 9, "epochs": 10})
    assert r.write() == 1
    r.shell.now += 1
    r.post(token, {"epoch": 10, "epochs": 10, "final": True})  # due at once, but the writer has not run yet
    _ended(r.shell, "mnist-chief-0", "Succeeded")
    r.shell.controller.reconcile(r.shell.key)
    status = r.shell.status()
    assert (status["phase"], status["progress"]["summary"], status["progress"]["epoch"]) == ("Succeeded", "100%", 10)
    assert r.write() == 0  # one write for both, nothing left for the writer


def test_a_final_report_whose_write_fails_is_written_by_the_retry():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 9, "epochs": 10})
    r.write()
    r.post(token, {"epoch": 10, "epochs": 10, "final": True})
    patch = r.shell.api.patch_job_status
    failures = []

    def unavailable_once(job, body):
        if not failures:
            failures.append(body)
            raise ConnectionError("the API server restarts")
        return patch(job, body)

    r.shell.api.patch_job_status = unavailable_once
    with pytest.raises(ConnectionError):
        r.write()
    assert r.progress()["epoch"] == 9 and failures
    r.shell.controller.reconcile(r.shell.key)  # the job's retry, with its backoff
    assert r.progress()["epoch"] == 10 and r.progress()["final"] is True
    assert r.write() == 0


def test_all_jobs_writes_stay_within_the_budget():
    r = Reporting(progress_writes_per_second=1)
    r.post(r.token_of("mnist-chief-0"), {"epoch": 1})
    r.post(r.token_of("other-chief-0"), {"epoch": 1})
    assert r.write() == 1  # the other waits for the next second's budget
    r.shell.now += 1
    assert r.write() == 1
    assert r.progress()["epoch"] == r.progress("other")["epoch"] == 1


def test_keys_the_program_no_longer_reports_are_gone_from_the_stored_status():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 3, "epochs": 10, "step": 300, "steps": 1000, "final": True})
    r.write()
    assert (r.progress()["epoch"], r.progress()["final"]) == (3, True)
    r.shell.now += 31
    r.post(token, {"step": 100})  # resumed from an older checkpoint: its epoch is not known any more
    r.write()
    stored = r.progress()
    assert stored["step"] == 100 and "epoch" not in stored and "final" not in stored
    uid = r.shell.api.jobs[r.shell.key]["metadata"]["uid"]
    assert stored == r.book.held(r.shell.key, uid).progress  # the stored value is the held one, key for key


def test_a_job_recreated_under_the_same_name_does_not_inherit_the_old_ones_progress():
    r = Reporting()
    r.post(r.token_of("mnist-chief-0"), {"epoch": 3, "epochs": 4, "metrics": {"loss": 0.5}})
    old_uid = r.shell.api.jobs[r.shell.key]["metadata"]["uid"]
    assert r.book.held(r.shell.key, old_uid) is not None
    assert r.book.held(r.shell.key, "the-uid-of-a-new-job") is None


# ---------------------------------------------------------------------- the training's health


def test_a_nan_loss_makes_the_running_job_unhealthy_with_one_warning_and_recovery_clears_it():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 1, "epochs": 4, "metrics": {"loss": "NaN"}})
    r.write()
    condition = r.condition()
    assert (condition["status"], condition["reason"]) == ("True", "LossNotFinite")
    assert r.shell.status()["phase"] == "Running"  # the job keeps running: what to do is the user's
    unhealthy = {"namespace": "team-a", "job": "mnist", "reason": "LossNotFinite"}
    assert REGISTRY.get_sample_value("kubetf_job_training_unhealthy", unhealthy) == 1
    r.reconcile()
    assert [reason for _, reason, _ in r.shell.api.recorded].count("LossNotFinite") == 1
    r.shell.now += 31
    r.post(token, {"epoch": 2, "metrics": {"loss": 0.4}})
    r.write()
    condition = r.condition()
    assert (condition["status"], condition["reason"]) == ("False", "Healthy")
    assert REGISTRY.get_sample_value("kubetf_job_training_unhealthy", unhealthy) is None


def test_a_running_job_whose_step_does_not_move_is_stalled_when_the_stall_falls_due():
    r = Reporting(progress_stall_seconds=600)
    r.post(r.token_of("mnist-chief-0"), {"step": 10, "steps": 100})
    r.write()
    plan = r.reconcile()
    assert plan is not None and plan.requeue_at == pytest.approx(T0 + 601)  # the wake-up that finds it
    r.shell.now = T0 + 601
    r.reconcile()
    condition = r.condition()
    assert (condition["status"], condition["reason"]) == ("True", "TrainingStalled")
    assert "no progress for 10m" in condition["message"]


def test_a_job_that_advances_is_never_stalled_however_old_its_stored_progress():
    # 3,000 jobs reporting and 5 writes a second: each job's stored progress is 10 minutes old. The judge reads the
    # freshest report the operator holds.
    r = Reporting(progress_stall_seconds=600, progress_write_seconds=10**9)  # the first write, then none
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 1, "steps": 10_000})
    r.write()
    for minute in range(1, 40):
        r.shell.now = T0 + 60 * minute
        r.post(token, {"step": 1 + minute, "steps": 10_000})
        assert r.write() == 0
        r.reconcile()
    # stored long ago (the write that said its training began, kubetf.core.goodput, carried step 2) ...
    assert r.progress()["step"] <= 2
    assert (r.condition() or {}).get("status") != "True"  # ... yet the job is not judged on it
    assert not [reason for _, reason, _ in r.shell.api.recorded if reason == "TrainingStalled"]


def test_a_coordinator_that_crashed_once_and_then_stops_reporting_is_stalled():
    # The client sends "final" at every exit, a crash's too: that must not switch the stall judge off for good.
    r = Reporting(progress_stall_seconds=600)
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 10, "steps": 100})
    r.write()
    r.shell.now += 5
    r.post(token, {"step": 12, "steps": 100, "final": True})  # the crash's exit
    r.write()
    r.shell.now += 5
    r.post(token, {"step": 10, "steps": 100})  # the restarted program resumes, reports once, then hangs
    r.shell.now += 30
    r.write()
    assert "final" not in r.progress()
    r.shell.now += 700
    r.reconcile()
    assert (r.condition()["status"], r.condition()["reason"]) == ("True", "TrainingStalled")


def test_a_finished_coordinator_is_not_stalled_while_the_other_workers_finish():
    r = Reporting(progress_stall_seconds=600)
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 100, "steps": 100, "final": True})
    r.write()
    _ended(r.shell, "mnist-chief-0", "Succeeded")
    r.shell.now += 7200
    r.reconcile()
    assert (r.condition() or {}).get("status") != "True"


# ---------------------------------------------------------------------- the job's series, leadership, the pods


def test_the_jobs_gauges_show_its_progress_follow_its_metrics_and_go_with_it():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 1, "epochs": 4, "metrics": {"loss": 0.5, "accuracy": 0.4}})
    labels = {"namespace": "team-a", "job": "mnist"}
    assert REGISTRY.get_sample_value("kubetf_job_progress_ratio", labels) == 0.25
    assert REGISTRY.get_sample_value("kubetf_job_metric", {**labels, "metric": "accuracy"}) == 0.4
    r.shell.api.delete_job("team-a", "mnist")
    r.shell.api.deliver(r.shell.controller)  # the DELETED event queues the job: its farewell runs on a worker
    assert REGISTRY.get_sample_value("kubetf_job_progress_ratio", labels) == 0.25
    r.shell.controller.reconcile(r.shell.key)
    assert REGISTRY.get_sample_value("kubetf_job_progress_ratio", labels) is None
    assert REGISTRY.get_sample_value("kubetf_job_metric", {**labels, "metric": "loss"}) is None
    assert REGISTRY.get_sample_value("kubetf_job_metric", {**labels, "metric": "accuracy"}) is None


def test_after_a_lost_lease_the_job_is_read_again_before_its_progress_is_written():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 10, "steps": 100})
    r.write()
    r.shell.controller.leadership(False)
    r.endpoint.leadership(False)
    # Meanwhile another leader wrote what it was told: this one must not write its older view over it.
    later = merge.merge(r.progress(), protocol.parse_report(b'{"step": 50, "steps": 100}'), "chief", 0, True,
                        r.shell.now + 5)  # fmt: skip
    r.shell.api.patch_job_status(r.shell.api.jobs[r.shell.key], {"progress": later})
    r.shell.now += 10
    r.post(token, {"step": 60, "steps": 100})
    r.shell.now += 30
    r.write()
    assert [p["step"] for p in r.progress()["history"]] == [10, 50, 60]


def test_the_cache_keeps_no_progress_history():
    from kubetf.cluster.cache import slim_job

    job = mwms()
    job["status"] = {"phase": "Running", "progress": {"epoch": 1, "history": [{"epoch": 1, "loss": 0.5}] * 60}}
    assert slim_job(job)["status"] == {"phase": "Running", "progress": {"epoch": 1}}


def test_pods_get_the_url_and_a_token_for_the_endpoint_only():
    r = Reporting()
    pod = r.shell.api.pods["mnist-worker-0"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KUBETF_PROGRESS_URL"] == URL
    assert env["KUBETF_PROGRESS_TOKEN_FILE"] == f"{identity.TOKEN_PATH}/token"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == builders.PROGRESS_VOLUME]
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == identity.AUDIENCE
    mount = {"name": builders.PROGRESS_VOLUME, "mountPath": identity.TOKEN_PATH, "readOnly": True}
    assert mount in container["volumeMounts"]
    quiet = Shell(mwms()).running()  # no URL configured: pods are not told to report
    assert "KUBETF_PROGRESS_URL" not in {
        e["name"] for e in quiet.api.pods["mnist-worker-0"]["spec"]["containers"][0]["env"]
    }


# ---------------------------------------------------------------------- fair shares of the reviews


def test_a_namespace_forging_tokens_spends_its_own_share_of_the_reviews_not_another_namespaces():
    pods = {"uid-attacker": "team-evil", "uid-victim": "team-a"}
    valid = set()

    def review(token: str) -> dict:
        if token not in valid:
            return {"authenticated": False}
        return {
            "authenticated": True,
            "audiences": [identity.AUDIENCE],
            "user": {"username": "system:serviceaccount:team-a:default",
                     "extra": {identity.POD_NAME_EXTRA: ["mnist-chief-0"], identity.POD_UID_EXTRA: ["uid-victim"]}},
        }  # fmt: skip

    now = [0.0]
    budget = Budget(10, 20, clock=lambda: now[0])  # the endpoint's: 10 reviews a second, 20 at once
    auth = Authenticator(review, budget, pods.get, lambda: Budget(1, 3, clock=lambda: now[0]), clock=lambda: T0)

    def token(uid: str, n: int) -> str:
        return jwt({"aud": [identity.AUDIENCE], "exp": T0 + 600, "kubernetes.io": {"pod": {"uid": uid}}, "n": n})

    forged = [done(auth.authenticate(f"Bearer {token('uid-attacker', n)}")) for n in range(40)]
    # its own share (3), then the budget down to half its burst (7 more): the rest is kept for the others
    assert [a.status for a in forged] == [401] * 10 + [429] * 30
    assert "namespace team-evil has used its share" in forged[-1].error
    victims = token("uid-victim", 0)
    valid.add(victims)
    first = auth.authenticate(f"Bearer {victims}")
    assert isinstance(first, Slow)  # a new token: reviewed (on the port's slow pool), within team-a's own share
    assert done(first).uid == "uid-victim"
    again = auth.authenticate(f"Bearer {victims}")
    assert not isinstance(again, Slow) and again.uid == "uid-victim"  # heard before: no review, no waiting
    now[0] += 1.0  # a second on: the attacker again takes only what goes past half the burst
    later = [done(auth.authenticate(f"Bearer {token('uid-attacker', n)}")).status for n in range(40, 60)]
    assert later.count(401) <= 10
