import time

from kubetf.cli import jobctl

from .jobs import job, replica


def test_progress_lines_are_recognised_and_other_output_is_not():
    assert jobctl.progress_line('{"kubetf": "progress", "epoch": 2, "epochs": 5, "loss": 0.5}')["epoch"] == 2
    assert jobctl.progress_line("Epoch 2/5 - loss: 0.5") is None
    assert jobctl.progress_line('{"other": 1}') is None
    assert jobctl.progress_line('{"kubetf": broken') is None


def test_progress_is_described_for_people():
    text = jobctl.describe_progress(
        {
            "kubetf": "progress",
            "role": "worker",
            "index": 0,
            "epoch": 2,
            "epochs": 4,
            "loss": 0.123456,
            "metrics": {"accuracy": 0.9},
        }
    )
    assert text == "[##########..........] epoch 2/4 loss=0.1235 accuracy=0.9"
    assert jobctl.describe_progress({"kubetf": "start", "role": "worker", "index": 1, "initial_epoch": 3}) == (
        "worker-1 started, resuming at epoch 3"
    )


def test_a_run_waiting_for_the_checkpoint_directory_says_so():
    holder = {"run": "9f1c", "job": "mnist"}
    waiting = {"kubetf": "fence", "role": "chief", "index": 0, "state": "waiting", "run": "1a2b", "holder": holder}
    assert jobctl.describe_progress(waiting) == (
        "chief-0 waits, without training: run 9f1c of job mnist holds the checkpoint directory"
    )
    done = {**waiting, "state": "finished elsewhere", "exit_code": 0}
    assert jobctl.describe_progress(done) == "chief-0 exits: run 9f1c of job mnist finished the training"


def test_progress_comes_from_the_chief_else_worker_zero():
    assert jobctl.progress_task(job(chief=replica(1), worker=replica(2))) == ("chief", 0)
    assert jobctl.progress_task(job(worker=replica(2))) == ("worker", 0)


def test_progress_lines_read_through_the_logs_prefix():
    record = jobctl.progress_line('worker-1 | {"kubetf": "done", "role": "worker"}')
    assert record == {"kubetf": "done", "role": "worker"}
    assert jobctl.progress_line('{"kubetf-like": 1}') is None


class Jobs:
    """The two reads `kubetf status` makes, from a list of job documents served one per call."""

    def get_job(self, namespace, name):
        return self.documents.pop(0) if len(self.documents) > 1 else self.documents[0]

    def __init__(self, *documents, events=()):
        self.documents = list(documents)
        self.events = list(events)

    def list_events(self, namespace, name, uid=None):
        return [e for e in self.events if uid is None or e["involvedObject"]["uid"] == uid]


def running_with_progress(phase="Running"):
    from kubetf.core.status import format_time

    history = [{"step": s, "epoch": s // 10, "loss": 2.0 / (1 + s), "time": format_time(1_800_000_000 + s)}
               for s in range(0, 60, 5)]  # fmt: skip
    return {
        "metadata": {"name": "mnist", "namespace": "ns"},
        "spec": {"strategy": "MultiWorkerMirrored", "replicaSpecs": {"worker": {"replicas": 2, "template": {}}}},
        "status": {
            "phase": phase,
            "progress": {"summary": "55%", "step": 55, "steps": 100, "stepsPerSecond": 2.5, "eta": "18s",
                         "metrics": {"loss": 0.036}, "history": history},
            "conditions": [{"type": "TrainingUnhealthy", "status": "True", "reason": "TrainingStalled",
                            "message": "no progress for 11m"}],
        },
    }  # fmt: skip


def test_status_shows_the_progress_its_health_and_the_loss_curve():
    import io

    out = io.StringIO()
    jobctl.print_status(Jobs(running_with_progress()), "ns", "mnist", out)
    text = out.getvalue()
    assert "progress: 55%  step 55/100  2.5 steps/s  ETA 18s" in text
    assert "metrics: loss=0.036" in text and "TrainingStalled: no progress for 11m" in text
    assert "loss by step" in text and text.count("*") >= 12  # a point for each of the 12 in the history


def test_status_watch_updates_until_the_job_finishes():
    import io

    out = io.StringIO()
    jobs = Jobs(running_with_progress(), running_with_progress(), running_with_progress("Succeeded"))
    assert jobctl.watch_status(jobs, "ns", "mnist", out, every=0, clear=False) == 0
    assert out.getvalue().count("progress: 55%") == 2 and "Succeeded" in out.getvalue()


def test_tensorboard_reads_the_jobs_logs_read_only_in_a_restricted_pod_the_job_owns():
    import pytest

    from kubetf.cli.jobctl import JobError
    from kubetf.cli.tensorboard import tensorboard_pod

    from .jobs import job, replica

    document = job(worker=replica(2))
    document["spec"]["checkpoint"] = {"size": "1Gi", "mountPath": "/checkpoints"}
    pod = tensorboard_pod(document)
    (container,) = pod["spec"]["containers"]
    assert container["command"][:3] == ["tensorboard", "--logdir", "/checkpoints/tensorboard"]
    assert (
        container["image"] == document["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["image"]
    )
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "mnist-checkpoint", "readOnly": True}
    assert container["volumeMounts"][0]["readOnly"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] and container["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    assert pod["metadata"]["ownerReferences"][0]["uid"] == document["metadata"]["uid"]
    with pytest.raises(JobError, match=r"has no spec\.checkpoint"):
        tensorboard_pod(job(worker=replica(2)))


def test_tensorboard_closes_every_open_port_forward_at_ctrl_c_and_any_that_opens_after():
    """The client's port-forward threads are not daemons: one left open kept `kubetf tensorboard` alive after
    Ctrl-C (e2e, a browser's keep-alive connection)."""
    from kubetf.cli.tensorboard import _OpenForwards

    class Forward:
        closed = False

        def close(self):
            self.closed = True

    forwards, done, still_open, late = _OpenForwards(), Forward(), Forward(), Forward()
    assert forwards.add(done) and forwards.add(still_open)
    forwards.discard(done)  # its connection ended: it closed itself
    forwards.close_all()
    assert still_open.closed and not done.closed
    assert not forwards.add(late)  # opened while Ctrl-C was handled: its thread closes it


def test_tensorboard_stops_on_ctrl_c_even_when_started_in_the_background_and_on_sigterm():
    """A shell that starts a command in the background ignores SIGINT for it, and Python then raises no
    KeyboardInterrupt: `kubetf tensorboard` kept running after Ctrl-C in CI. Both signals now stop it."""
    import signal
    import subprocess
    import sys

    program = (
        "import socket\n"
        "from kubetf.cli.tensorboard import _stop_on_signals\n"
        "_stop_on_signals()\n"
        "listener = socket.create_server(('127.0.0.1', 0))\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    listener.accept()\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped', flush=True)\n"
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        process = subprocess.Popen(
            [sys.executable, "-c", program],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a background job's
        )
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(sig)
        out, _ = process.communicate(timeout=20)
        assert (process.returncode, out.strip()) == (0, "stopped"), (sig, process.returncode, out)


def test_status_shows_the_events_of_this_job_not_of_an_earlier_one_of_its_name():
    """Issue 46: `make demo` run twice showed both runs' events: events belong to the job's uid."""
    import io

    from kubetf.cli.jobctl import print_status

    job = running_with_progress()
    job["metadata"]["uid"] = "new-uid"

    def event(uid, reason):
        return {"involvedObject": {"uid": uid}, "type": "Normal", "reason": reason, "message": "m",
                "lastTimestamp": "2026-11-28T00:00:00Z"}  # fmt: skip

    out = io.StringIO()
    print_status(Jobs(job, events=[event("old-uid", "FromTheEarlierJob"), event("new-uid", "CreatedPods")]), "ns",
                 "mnist", out)  # fmt: skip
    assert "CreatedPods" in out.getvalue() and "FromTheEarlierJob" not in out.getvalue()


def test_status_shows_the_goodput_counted_up_to_now():
    import io

    from kubetf.cli.jobctl import print_status
    from kubetf.core.status import format_time

    job = running_with_progress()
    now = time.time()
    job["metadata"]["creationTimestamp"] = format_time(now - 1000)
    job["status"]["goodput"] = {"state": "training", "since": format_time(now - 500),
                                "seconds": {"queued": 300.0, "starting": 100.0, "training": 100.0}}  # fmt: skip
    out = io.StringIO()
    print_status(Jobs(job), "ns", "mnist", out)
    line = next(x for x in out.getvalue().splitlines() if "goodput" in x)
    assert line.strip().startswith("goodput: 60% of 17m trained; lost: queued 5m, starting 2m")
