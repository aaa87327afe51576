"""Day one on a real cluster: install, train, preempt, resume (issue: helm, images, e2e)."""

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kubetf.cli import jobctl
from tests.cluster.fixture import wait_for

from .conftest import (
    OPERATOR_NAMESPACE,
    ROOT,
    columns,
    create,
    elapsed,
    progress,
    sample,
    table_row,
    wait_epoch,
)

SCREENSHOTS = ROOT / ".test-results"


class LogFollower(threading.Thread):
    """One pod's log as it is written, followed until its container ends (that pod: a pod made later under the same
    name is not followed): the trainer's records in it."""

    def __init__(self, cluster, namespace: str, pod: str) -> None:
        super().__init__(daemon=True)
        self.response = cluster.core.read_namespaced_pod_log(pod, namespace, follow=True, _preload_content=False)
        self.chunks: list[bytes] = []  # as they came: a line may span two
        self.start()

    def run(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends with the container, or breaks: what came is kept
            for chunk in self.response.stream(decode_content=True):
                self.chunks.append(chunk)

    def records(self) -> list[dict]:
        text = b"".join(list(self.chunks)).decode(errors="replace")
        return [r for r in map(jobctl.progress_line, text.splitlines()) if r]


class Columns(threading.Thread):
    """`kubectl get tj NAME` every second until stopped: the (PROGRESS, ETA) pairs it showed, in order, and
    status.progress.etaSeconds while the job ran."""

    def __init__(self, cluster, namespace: str, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.shown: list[tuple[str, str]] = []
        self.etas: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1):
            result = self.cluster.kubectl("get", "tj", self.name, "-n", self.namespace, check=False)
            if result.returncode == 0 and len(result.stdout.splitlines()) == 2:
                row = table_row(result.stdout)
                shown = (row.get("PROGRESS", ""), row.get("ETA", ""))
                if shown[0] and shown not in self.shown[-1:]:
                    self.shown.append(shown)
            try:
                status = (self.cluster.job(self.namespace, self.name) or {}).get("status") or {}
            except Exception:  # a slow API server: the next second's read
                continue
            eta = (status.get("progress") or {}).get("etaSeconds")
            if status.get("phase") == "Running" and isinstance(eta, int) and eta not in self.etas[-1:]:
                self.etas.append(eta)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


class TensorBoard:
    """`kubetf tensorboard JOB --port 0` as a user runs it: the URL it prints; Ctrl-C (SIGINT) ends it."""

    def __init__(self, namespace: str, name: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kubetf.cli", "tensorboard", name, "-n", namespace, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def url(self) -> str:
        def printed() -> str | None:
            if self.process.poll() is not None:
                pytest.fail(f"kubetf tensorboard exited {self.process.returncode}: {self.lines}")
            found = [m.group(1) for line in self.lines if (m := re.search(r"TensorBoard: (http://\S+/)", line))]
            return found[0] if found else None

        return wait_for(printed, 240, "kubetf tensorboard to print its URL", interval=0.5)

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.url() + path, timeout=60) as response:
            return json.load(response)

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)
        self.reader.join(10)  # what it printed last, up to its exit
        return "\n".join(self.lines)


# TensorBoard's colour for the first run (#425066): its line, the run's dot in the sidebar and in the card's legend.
RUN_COLOUR = (66, 80, 102)
# Without a line the page has about 240 such pixels (the dots, the icons' edges); the loss line of 6 epochs about 630.
LINE_PIXELS = 450


def chart_pixels(url: str, tag: str, screenshot: Path, within: float = 120) -> int:
    """Headless Chromium's screenshot of TensorBoard's page for `tag` (kept), taken again until it shows a line (the
    card may be drawn before its data came through the port-forward) or `within` seconds passed; the pixels of the
    run's colour on the last one. SVG, not WebGL: headless Chromium has no GPU to draw WebGL lines with."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.fail("chromium not found: apt-get install chromium (make tools installs it)")
    page = f"{url}?forceSVG=true&tagFilter={urllib.parse.quote(tag)}#timeseries"
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    deadline = time.monotonic() + within
    while True:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000",
             "--virtual-time-budget=30000", f"--screenshot={screenshot}", page],
            capture_output=True, timeout=180, check=True,
        )  # fmt: skip
        with Image.open(screenshot) as image:
            data = image.convert("RGB").tobytes()
        pixels = zip(data[0::3], data[1::3], data[2::3], strict=True)
        drawn = sum(1 for pixel in pixels if sum(abs(c - r) for c, r in zip(pixel, RUN_COLOUR, strict=True)) <= 24)
        if drawn > LINE_PIXELS or time.monotonic() > deadline:
            return drawn


def reader_pod(cluster, namespace, claim, command):
    """A pod that runs `command` with the job's checkpoint volume mounted, and returns its log."""
    name = f"reader-{int(time.time() * 1000) % 100000}"
    cluster.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "containers": [
                    {
                        "name": "read",
                        "image": "kubetf/python-base:bookworm",
                        "imagePullPolicy": "IfNotPresent",
                        "command": command,
                        "volumeMounts": [{"name": "c", "mountPath": "/checkpoints"}],
                    }
                ],
                "volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": claim}}],
            },
        },
    )
    wait_for(
        lambda: cluster.core.read_namespaced_pod(name, namespace).status.phase in ("Succeeded", "Failed"),
        120,
        f"{name} to finish",
        interval=0.5,
    )
    return cluster.core.read_namespaced_pod(name, namespace).status.phase, cluster.core.read_namespaced_pod_log(
        name, namespace
    )


def test_the_operator_runs_under_the_restricted_pod_security_standard(installed):
    apps = client.AppsV1Api(installed.api_client)
    (deployment,) = apps.list_namespaced_deployment(OPERATOR_NAMESPACE).items
    assert deployment.status.available_replicas == deployment.spec.replicas == 2  # a leader and a standby
    labels = installed.core.read_namespace(OPERATOR_NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.tensorflow
def test_a_submitted_job_evicted_mid_training_saves_resumes_and_leaves_its_model(installed, namespace, tmp_path):
    """Day one, from `kubetf submit` to `kubetf delete`: the MNIST sample is followed with its progress; a worker is
    evicted mid-training; the trainer library's program saves on the SIGTERM (PreemptionCheckpointHandler, exit
    42) within its grace period (the operator does not hurry it: no SigtermIgnored); the whole group restarts once,
    counted as a disruption, resumes from that checkpoint and succeeds, and its model is on the checkpoint volume."""
    cluster = installed
    job = sample("mnist-mwms")
    container = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["args"] = [{"5": "6", "20": "30"}.get(a, a) for a in container["args"]]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    start = time.monotonic()
    watched = Columns(cluster, namespace, "mnist-mwms")
    watched.start()
    submit = subprocess.Popen(
        [sys.executable, "-m", "kubetf.cli", "submit", "-f", str(path), "-n", namespace, "--timeout", "900"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_epoch(cluster, namespace, "mnist-mwms-worker-0", 2, "two epochs done (a checkpoint to resume from)", 600)
    # worker-1's log followed from before the eviction: read by name afterwards, it was the next attempt's pod's
    # (without a native gang, on 1.35, the replacement came 3 s after the evicted pod exited).
    followed = LogFollower(cluster, namespace, "mnist-mwms-worker-1")
    evicted = time.monotonic()
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "mnist-mwms-worker-1"}}
    cluster.core.create_namespaced_pod_eviction("mnist-mwms-worker-1", namespace, body)

    def saved() -> list[dict]:
        return [r for r in followed.records() if r["kubetf"] == "preempted"]

    (record,) = wait_for(saved, 120, "worker-1 saved on the SIGTERM and left", interval=0.5)
    print(f"\neviction -> worker-1 saved and exited {record['exit_code']}: {elapsed(evicted)}")
    assert record["saved"] is True and record["exit_code"] == 42, record
    output, _ = submit.communicate(timeout=960)
    watched.stop()
    print(f"mnist-mwms: apply -> Succeeded {elapsed(start)}\n{output}")
    print(f"kubectl get tj PROGRESS, ETA while it trained: {watched.shown}; etaSeconds: {watched.etas}")
    assert submit.returncode == 0, output
    assert "epoch 6/6" in output
    # Everyone's view of how far it is: kubectl's columns while it trained, an ETA that fell, 100% at the end.
    assert any(re.fullmatch(r"\d+%", p) and 0 < int(p[:-1]) < 100 and eta for p, eta in watched.shown), watched.shown
    assert len(watched.etas) >= 2 and watched.etas[-1] < watched.etas[0], watched.etas
    assert columns(cluster, namespace, "mnist-mwms")["PROGRESS"] == "100%"
    status = cluster.status(namespace, "mnist-mwms")
    assert (status["progress"]["epoch"], status["progress"]["epochs"]) == (6, 6), status["progress"]
    assert (status["phase"], status["restarts"]["disruptions"], status["restarts"]["failures"]) == ("Succeeded", 1, 0)
    assert status["tasks"]["worker-0"]["attempt"] == 1  # the whole group restarted
    ignored = cluster.core.list_namespaced_event(namespace, field_selector="reason=SigtermIgnored").items
    assert ignored == [], [e.message for e in ignored]
    records = progress(cluster, namespace, "mnist-mwms-worker-0")  # the replacement pod's log
    starts = [r for r in records if r["kubetf"] == "start"]
    assert len(starts) == 1, records
    (resumed,) = starts
    assert resumed["initial_epoch"] >= 2, records  # from the checkpoint saved at the eviction, not from scratch
    epochs = [r["epoch"] for r in records if r["kubetf"] == "progress"]
    assert epochs == list(range(resumed["initial_epoch"] + 1, 7)), records
    losses = [r["loss"] for r in records if r["kubetf"] == "progress"]
    assert losses[-1] <= losses[0]
    assert [r for r in records if r["kubetf"] == "done"], records
    # The chief's (worker 0's) final model is on the PVC, readable by the next pod that mounts it.
    phase, listing = reader_pod(
        cluster, namespace, "mnist-mwms-checkpoint", ["sh", "-c", "ls -R /checkpoints/model | head -50"]
    )
    assert phase == "Succeeded", listing
    assert "saved_model.pb" in listing or ".keras" in listing or "variables" in listing, listing
    running = [p for p in cluster.pods(namespace, "mnist-mwms").values() if p["status"]["phase"] == "Running"]
    assert running == []  # nothing of the job keeps running

    def kubetf(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "kubetf.cli", *args, "-n", namespace],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "Succeeded" in kubetf("status", "mnist-mwms")
    logs = kubetf("logs", "mnist-mwms").splitlines()
    assert any(line.startswith("worker-1 | ") for line in logs), logs[-20:]
    assert any(line.startswith("worker-0 | ") and '"kubetf": "done"' in line for line in logs), logs[-20:]
    # Its curves: TensorBoard on the checkpoint volume, through `kubetf tensorboard`.
    board = TensorBoard(namespace, "mnist-mwms")
    try:
        tags = board.get("data/plugin/scalars/tags")
        (run,) = [run for run, run_tags in tags.items() if "epoch_loss" in run_tags]
        query = urllib.parse.urlencode({"run": run, "tag": "epoch_loss"})
        series = board.get(f"data/plugin/scalars/scalars?{query}")  # [wall time, step (epoch), value]
        screenshot = SCREENSHOTS / f"tensorboard-{namespace}.png"
        drawn = chart_pixels(board.url(), "epoch_loss", screenshot)
    finally:
        said = board.stop()
    print(f"TensorBoard's epoch_loss: {series}; page saved to {screenshot}: {drawn} pixels of the run's colour")
    assert {step for _, step, _ in series} == set(range(6)), series  # every epoch, across the restart
    assert drawn > LINE_PIXELS, f"no line of epoch_loss on the page ({drawn} pixels of its colour): {screenshot}"
    assert "deleted pod mnist-mwms-tensorboard" in said, said
    wait_for(lambda: not cluster.core.list_namespaced_pod(namespace, label_selector="kubetf.io/tensorboard").items,
             60, "the TensorBoard pod deleted")  # fmt: skip
    deleted = kubetf("delete", "mnist-mwms")
    assert "checkpoint PVC mnist-mwms-checkpoint kept" in deleted
    wait_for(lambda: cluster.job(namespace, "mnist-mwms") is None, 30, "the job deleted")
    assert cluster.core.read_namespaced_persistent_volume_claim("mnist-mwms-checkpoint", namespace)


@pytest.mark.tensorflow
def test_parameter_server_job_with_evaluator_succeeds_and_a_deleted_worker_is_recreated_alone(installed, namespace):
    cluster = installed
    job = sample("ps-training")
    # 8 epochs, not the sample's 4: the worker deleted after the first one is seen gone while training goes on.
    for spec in job["spec"]["replicaSpecs"].values():
        args = spec["template"]["spec"]["containers"][0]["args"]
        args[args.index("--epochs") + 1] = "8"
    create(cluster, namespace, job)
    wait_epoch(cluster, namespace, "ps-training-chief-0", 1, "a first epoch", timeout=300)
    before = {n: p["metadata"]["uid"] for n, p in cluster.live_pods(namespace, "ps-training").items()}
    cluster.delete_pod(cluster.pods(namespace, "ps-training")["ps-training-worker-1"])
    status = cluster.wait_phase(namespace, "ps-training", "Succeeded", timeout=900)
    assert status["restarts"]["disruptions"] == 1
    assert status["tasks"]["worker-1"]["attempt"] == 1
    assert all(status["tasks"][t]["attempt"] == 0 for t in ("chief-0", "worker-0", "ps-0", "evaluator-0"))
    assert "ps-training-worker-1" in before
    # The evaluator, a sidecar, may start after training is over (TensorFlow's import is slow on a loaded node):
    # the job's success leaves it evaluatorGraceSeconds to evaluate every checkpoint, the last one too, and exit.
    wait_for(
        lambda: cluster.pods(namespace, "ps-training")["ps-training-evaluator-0"]["status"]["phase"] == "Succeeded",
        120, "the evaluator to exit on its own after its last evaluation",
    )  # fmt: skip
    evals = [r["epoch"] for r in progress(cluster, namespace, "ps-training-evaluator-0") if r["kubetf"] == "eval"]
    assert evals == list(range(1, 9)), evals  # each checkpoint once, in order, the final one included
    # ps and workers never exit by themselves: cleanPodPolicy Running stopped them.
    wait_for(
        lambda: all(p["status"]["phase"] != "Running" for p in cluster.live_pods(namespace, "ps-training").values()),
        60,
        "ps/worker pods stopped",
    )


def test_a_job_asking_for_more_gpus_than_the_node_has_stays_pending_and_says_why(installed, namespace):
    cluster = installed
    job = sample("mirrored")
    job["spec"]["replicaSpecs"]["chief"]["gpus"] = 64
    create(cluster, namespace, job)

    def says_why():
        status = cluster.status(namespace, "mirrored")
        current = next((c for c in status.get("conditions", []) if c["status"] == "True"), {})
        return "Insufficient nvidia.com/gpu" in current.get("message", "") and status

    # The scheduler's reason, once the checkpoint claim is bound: the GPUs.
    status = wait_for(says_why, 60, "the scheduler's GPU message in the condition")
    assert (status["phase"], status["reason"]) == ("Pending", "Unschedulable")
    installed.wait_event(namespace, "mirrored", "Unschedulable")


def test_a_missing_image_says_image_pull_backoff_then_fails_after_the_startup_timeout(installed, namespace):
    cluster = installed
    job = sample("mirrored")
    job["spec"]["replicaSpecs"]["chief"].pop("gpus")
    container = job["spec"]["replicaSpecs"]["chief"]["template"]["spec"]["containers"][0]
    container["image"] = "kubetf/missing:0.0.1"
    # Scheduled at once, however busy the node: with the sample's 1 CPU it waited Unschedulable behind the other
    # tests' TensorFlow pods until its startup timeout, and never reached the image pull (CI run 28).
    container["resources"] = {"requests": {"cpu": "10m", "memory": "32Mi"}}
    job["spec"]["runPolicy"] = {"startupTimeoutSeconds": 40}
    create(cluster, namespace, job)
    reasons = set()

    def failed():
        status = cluster.status(namespace, "mirrored")
        reasons.add(status.get("reason"))
        return status.get("phase") == "Failed" and status

    status = wait_for(failed, 120, "StartupTimeout", interval=0.5)
    assert reasons & {"ImagePullBackOff", "ErrImagePull"}, reasons
    assert status["reason"] == "StartupTimeout"
    message = next(c["message"] for c in status["conditions"] if c["status"] == "True")
    assert "Image" in message or "image" in message
