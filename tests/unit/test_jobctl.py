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


def test_progress_comes_from_the_chief_else_worker_zero():
    assert jobctl.progress_task(job(chief=replica(1), worker=replica(2))) == ("chief", 0)
    assert jobctl.progress_task(job(worker=replica(2))) == ("worker", 0)


def test_progress_lines_read_through_the_logs_prefix():
    record = jobctl.progress_line('worker-1 | {"kubetf": "done", "role": "worker"}')
    assert record == {"kubetf": "done", "role": "worker"}
    assert jobctl.progress_line('{"kubetf-like": 1}') is None
