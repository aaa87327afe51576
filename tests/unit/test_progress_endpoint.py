"""The progress endpoint (kubetf.runtime.progress) against the fake API: who may report, what is refused, how the
writes are coalesced; the pods' token and URL (builders); the TrainingUnhealthy condition (core.progress)."""

import json

import pytest
from prometheus_client import REGISTRY

from kubetf.core import builders
from kubetf.core import progress as pg
from kubetf.runtime.progress import ProgressEndpoint

from .test_controller import T0, Shell, _ended, mwms

pytestmark = pytest.mark.unit

URL = "http://kubetf-progress.kubetf-system.svc:8090/v1/progress"


class Reporting:
    """A running MWMS job (`mnist`), a second one (`other`) and the endpoint of the leader, in fake time."""

    def __init__(self, **config):
        self.shell = Shell(mwms(), progress_url=URL, **config).running()
        other = mwms()
        other["metadata"].update(name="other", uid="5678-uid")
        self.shell.api.add_job(other)
        self.shell.api.deliver(self.shell.controller)
        self.shell.controller.reconcile(("team-a", "other"))
        self.shell.api.deliver(self.shell.controller)
        self.endpoint = ProgressEndpoint(self.shell.controller.config, clock=lambda: self.shell.now)
        self.leader = True
        self.endpoint.lead(self.shell.api, self.shell.controller.store, lambda: self.leader)
        self.shell.controller.executor.progress = self.endpoint  # as the runner wires them

    def token_of(self, pod_name: str) -> str:
        pod = self.shell.api.pods[pod_name]
        token = f"token-of-{pod_name}"
        self.shell.api.tokens[token] = ("team-a", "default", pod_name, pod["metadata"]["uid"])
        return token

    def post(self, token: str | None, body: dict | bytes) -> tuple[int, str | None]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = self.endpoint.receive(f"Bearer {token}" if token else None, raw)
        return answer.status, answer.error

    def progress(self, job: str = "mnist") -> dict | None:
        return (self.shell.api.jobs[("team-a", job)].get("status") or {}).get("progress")

    def writes(self) -> int:
        return self.shell.api.calls.count("patch status")


def test_the_chiefs_report_becomes_the_jobs_progress_at_once():
    r = Reporting()
    assert r.post(r.token_of("mnist-chief-0"), {"epoch": 1, "epochs": 4, "metrics": {"loss": 0.5}}) == (204, None)
    assert r.endpoint.write_due() == 1
    progress = r.progress()
    assert (progress["epoch"], progress["epochs"], progress["summary"]) == (1, 4, "25%")
    assert progress["metrics"] == {"loss": 0.5}


def test_a_pod_reports_for_its_own_job_whatever_it_says():
    r = Reporting()
    body = {"epoch": 2, "epochs": 4, "job": "other"}  # an unknown field is refused: no way to name another job
    assert r.post(r.token_of("mnist-chief-0"), body)[0] == 400
    assert r.post(r.token_of("mnist-chief-0"), {"epoch": 2, "epochs": 4}) == (204, None)
    r.endpoint.write_due()
    assert r.progress()["epoch"] == 2 and r.progress("other") is None


@pytest.mark.parametrize(
    "authorization, status",
    [
        (None, 401),  # no token
        ("not-a-token", 401),  # the API server does not know it
    ],
)
def test_a_report_without_a_valid_token_is_refused_and_nothing_is_written(authorization, status):
    r = Reporting()
    before = r.writes()
    assert r.post(authorization, {"epoch": 1})[0] == status
    assert r.endpoint.write_due() == 0 and r.writes() == before and r.progress() is None


def test_a_token_for_another_audience_or_of_a_pod_not_ours_is_refused():
    r = Reporting()
    r.shell.api.tokens["stranger"] = ("team-a", "default", "jupyter-0", "uid-of-jupyter")
    assert r.post("stranger", {"epoch": 1})[0] == 403
    token = r.token_of("mnist-chief-0")
    r.shell.api.token_audience = "https://kubernetes.default.svc"  # a token made for the API server itself
    r.endpoint.tokens.clear()
    assert r.post(token, {"epoch": 1})[0] == 401
    assert r.progress() is None


def test_an_oversized_or_malformed_report_is_refused_with_its_reason_and_nothing_is_written():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    status, error = r.post(token, b"{" + b" " * pg.MAX_BODY + b"}")
    assert status == 413 and "at most 16384 bytes" in error
    status, error = r.post(token, {"epoch": 1, "metrics": {"loss": "lots"}})
    assert status == 400 and error.startswith("metrics.loss")
    assert r.endpoint.write_due() == 0 and r.progress() is None


def test_a_standby_says_retry():
    r = Reporting()
    r.leader = False
    assert r.post(r.token_of("mnist-chief-0"), {"epoch": 1})[0] == 503


def test_writes_are_coalesced_per_job_and_the_final_report_goes_at_once():
    r = Reporting(progress_write_seconds=30)
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 10, "steps": 100})
    assert r.endpoint.write_due() == 1
    for step in range(20, 80, 10):  # a report a second: one write 30 s after the first
        r.shell.now += 1
        r.post(token, {"step": step, "steps": 100})
        assert r.endpoint.write_due() == 0
    r.shell.now = T0 + 30
    assert r.endpoint.write_due() == 1 and r.progress()["step"] == 70
    r.shell.now += 1
    r.post(token, {"step": 100, "steps": 100, "final": True})
    assert r.endpoint.write_due() == 1 and r.progress()["summary"] == "100%"


def test_the_status_write_that_says_the_job_ended_carries_its_last_report():
    # CI run 42: the chief's final report was accepted, its pod exited, and the job read Succeeded at 90% until the
    # progress writer's turn came. The executor's write now carries what the writer has not written yet.
    r = Reporting(progress_write_seconds=30)
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 9, "epochs": 10})
    assert r.endpoint.write_due() == 1
    r.shell.now += 1
    r.post(token, {"epoch": 10, "epochs": 10, "final": True})  # due at once, but the writer has not run yet
    _ended(r.shell, "mnist-chief-0", "Succeeded")
    r.shell.controller.reconcile(r.shell.key)
    status = r.shell.status()
    assert (status["phase"], status["progress"]["summary"], status["progress"]["epoch"]) == ("Succeeded", "100%", 10)
    assert r.endpoint.write_due() == 0  # one write for both, nothing left for the writer


def test_a_status_write_during_the_writers_own_carries_the_progress_in_flight():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    seen_meanwhile = []
    patch = r.shell.api.patch_job_status

    def writers_patch(job, body):
        seen_meanwhile.append(r.endpoint.unwritten(r.shell.key))  # what an executor's write now would carry
        return patch(job, body)

    r.post(token, {"epoch": 3, "epochs": 4})
    r.shell.api.patch_job_status = writers_patch
    assert r.endpoint.write_due() == 1
    assert [p["epoch"] for p in seen_meanwhile] == [3]
    assert r.endpoint.unwritten(r.shell.key) is None  # written: the executor's next write leaves progress alone


def test_all_jobs_writes_stay_within_the_budget():
    r = Reporting(progress_writes_per_second=1)
    r.post(r.token_of("mnist-chief-0"), {"epoch": 1})
    r.post(r.token_of("other-chief-0"), {"epoch": 1})
    assert r.endpoint.write_due() == 1  # the other waits for the next second's budget
    r.shell.now += 1
    assert r.endpoint.write_due() == 1
    assert r.progress()["epoch"] == r.progress("other")["epoch"] == 1


def test_a_workers_report_changes_nothing_and_the_token_is_reviewed_once():
    r = Reporting()
    token = r.token_of("mnist-worker-1")
    assert r.post(token, {"epoch": 1}) == (204, None)
    assert r.post(token, {"epoch": 2}) == (204, None)
    assert r.shell.api.calls.count("create TokenReview") == 1
    r.endpoint.write_due()
    assert not (r.progress() or {}).get("epoch")  # only the chief (else worker 0) speaks for the training


def test_the_jobs_gauges_show_its_progress_and_go_with_it():
    r = Reporting()
    r.post(r.token_of("mnist-chief-0"), {"epoch": 1, "epochs": 4, "metrics": {"loss": 0.5}})
    labels = {"namespace": "team-a", "job": "mnist"}
    assert REGISTRY.get_sample_value("kubetf_job_progress_ratio", labels) == 0.25
    assert REGISTRY.get_sample_value("kubetf_job_metric", {**labels, "metric": "loss"}) == 0.5
    r.shell.api.delete_job("team-a", "mnist")
    r.shell.controller.on_job_deleted = r.endpoint.forget
    r.shell.api.deliver(r.shell.controller)
    assert REGISTRY.get_sample_value("kubetf_job_progress_ratio", labels) is None
    assert REGISTRY.get_sample_value("kubetf_job_metric", {**labels, "metric": "loss"}) is None


def test_pods_get_the_url_and_a_token_for_the_endpoint_only():
    r = Reporting()
    pod = r.shell.api.pods["mnist-worker-0"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KUBETF_PROGRESS_URL"] == URL
    assert env["KUBETF_PROGRESS_TOKEN_FILE"] == f"{pg.TOKEN_PATH}/token"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == builders.PROGRESS_VOLUME]
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == pg.AUDIENCE
    assert {"name": builders.PROGRESS_VOLUME, "mountPath": pg.TOKEN_PATH, "readOnly": True} in container["volumeMounts"]
    quiet = Shell(mwms()).running()  # no URL configured: pods are not told to report
    assert "KUBETF_PROGRESS_URL" not in {
        e["name"] for e in quiet.api.pods["mnist-worker-0"]["spec"]["containers"][0]["env"]
    }


def test_a_nan_loss_makes_the_running_job_unhealthy_with_one_warning_and_recovery_clears_it():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"epoch": 1, "epochs": 4, "metrics": {"loss": "NaN"}})
    r.endpoint.write_due()
    r.shell.api.deliver(r.shell.controller)
    r.shell.controller.reconcile(r.shell.key)
    condition = next(c for c in r.shell.status()["conditions"] if c["type"] == pg.UNHEALTHY)
    assert (condition["status"], condition["reason"]) == ("True", "LossNotFinite")
    assert r.shell.status()["phase"] == "Running"  # the job keeps running: what to do is the user's
    unhealthy = {"namespace": "team-a", "job": "mnist", "reason": "LossNotFinite"}
    assert REGISTRY.get_sample_value("kubetf_job_training_unhealthy", unhealthy) == 1
    r.shell.controller.reconcile(r.shell.key)
    assert [reason for _, reason, _ in r.shell.api.recorded].count("LossNotFinite") == 1
    r.shell.now += 31
    r.post(token, {"epoch": 2, "metrics": {"loss": 0.4}})
    r.endpoint.write_due()
    r.shell.api.deliver(r.shell.controller)
    r.shell.controller.reconcile(r.shell.key)
    condition = next(c for c in r.shell.status()["conditions"] if c["type"] == pg.UNHEALTHY)
    assert (condition["status"], condition["reason"]) == ("False", "Healthy")
    assert REGISTRY.get_sample_value("kubetf_job_training_unhealthy", unhealthy) is None


def test_a_running_job_whose_step_does_not_move_is_stalled_when_the_stall_falls_due():
    r = Reporting(progress_stall_seconds=600)
    r.post(r.token_of("mnist-chief-0"), {"step": 10, "steps": 100})
    r.endpoint.write_due()
    r.shell.api.deliver(r.shell.controller)
    plan = r.shell.controller.reconcile(r.shell.key)
    assert plan is not None and plan.requeue_at == pytest.approx(T0 + 601)  # the wake-up that finds it
    r.shell.now = T0 + 601
    r.shell.controller.reconcile(r.shell.key)
    condition = next(c for c in r.shell.status()["conditions"] if c["type"] == pg.UNHEALTHY)
    assert (condition["status"], condition["reason"]) == ("True", "TrainingStalled")
    assert "no progress for 10m" in condition["message"]


def test_the_cache_keeps_no_progress_history():
    from kubetf.cluster.cache import slim_job

    job = mwms()
    job["status"] = {"phase": "Running", "progress": {"epoch": 1, "history": [{"epoch": 1, "loss": 0.5}] * 60}}
    assert slim_job(job)["status"] == {"phase": "Running", "progress": {"epoch": 1}}


def test_after_a_lost_lease_the_job_is_read_again_before_its_progress_is_written():
    r = Reporting()
    token = r.token_of("mnist-chief-0")
    r.post(token, {"step": 10, "steps": 100})
    r.endpoint.write_due()
    r.endpoint.leadership(False)
    # Meanwhile another leader wrote what it was told: this one must not write its older view over it.
    r.shell.api.patch_job_status(r.shell.api.jobs[r.shell.key], {"progress": pg.merge(
        r.progress(), pg.parse_report(b'{"step": 50, "steps": 100}'), "chief", 0, True, r.shell.now + 5)})  # fmt: skip
    r.shell.now += 10
    r.post(token, {"step": 60, "steps": 100})
    r.endpoint.write_due()
    assert [p["step"] for p in r.progress()["history"]] == [10, 50, 60]
