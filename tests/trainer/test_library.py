"""Fast checks of kubetf_trainer and kubetf local's helpers (no TensorFlow processes)."""

from __future__ import annotations

import io
import json
import os
import sys

import numpy as np
import pytest
from conftest import REPO, make_job

from kubetf.cli import local
from kubetf.cli.jobctl import progress_line
from kubetf.core import api, builders
from kubetf_trainer import data
from kubetf_trainer.env import clear_backup_scratch, task_info
from kubetf_trainer.progress import emit


def _env(job, role, index, ckpt=None):
    job = api.with_defaults(job)
    return builders.task_env(job, role, index, address_of=lambda r, i: f"localhost:{2000 + i}", checkpoint_dir=ckpt)


def test_task_info_reads_what_the_operator_injects():
    job = make_job(
        "j", "ParameterServer", {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}, [], example="ps_training.py"
    )
    chief = task_info(_env(job, "chief", 0, "/ckpt"))
    assert (chief.role, chief.index, chief.strategy, chief.job_name) == ("chief", 0, "ParameterServer", "j")
    assert chief.is_chief and not chief.is_ps_server and chief.num_workers == 3
    assert chief.backup_dir == "/ckpt/backup" and chief.model_dir == "/ckpt/model"
    worker0 = task_info(_env(job, "worker", 0))
    assert worker0.is_ps_server and not worker0.is_chief  # a chief exists: worker 0 is not the chief
    evaluator = task_info(_env(job, "evaluator", 0))
    assert evaluator.is_evaluator and evaluator.cluster == {"evaluator": ["localhost:2000"]}


def test_every_strategy_the_operator_accepts_is_known_to_the_library():
    for strategy in api.STRATEGIES:
        job = make_job("j", strategy, {"worker": 1}, [], example="mnist_mwms.py")
        assert task_info(_env(job, "worker", 0)).strategy == strategy


def test_worker0_is_chief_without_a_chief_and_standalone_defaults():
    job = make_job("m", "MultiWorkerMirrored", {"worker": 2}, [], example="mnist_mwms.py")
    assert task_info(_env(job, "worker", 0)).is_chief
    assert not task_info(_env(job, "worker", 1)).is_chief
    alone = task_info({})
    assert (alone.role, alone.index, alone.strategy, alone.is_chief) == ("worker", 0, "Mirrored", True)
    with pytest.raises(ValueError):
        task_info({"KUBETF_STRATEGY": "Horovod"})


def test_a_killed_workers_backup_scratch_is_cleared_and_the_chiefs_backup_kept(tmp_path):
    # What a non-chief MWMS worker SIGKILLed while tf-keras deleted its scratch copy leaves: the state
    # file still names ckpt-2, whose data is gone; restoring from it raised NotFoundError on restart.
    backup = tmp_path / "backup"
    for name in ("checkpoint", "ckpt-2.index", "ckpt-2.data-00000-of-00001"):
        (backup / "chief").mkdir(parents=True, exist_ok=True)
        (backup / "chief" / name).write_text("x")
    (backup / "workertemp_1").mkdir()
    (backup / "workertemp_1" / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    (backup / "workertemp_2").mkdir()

    assert clear_backup_scratch(str(backup), 1)
    assert sorted(os.listdir(backup)) == ["chief", "workertemp_2"]  # only this worker's scratch
    assert len(os.listdir(backup / "chief")) == 3
    assert not clear_backup_scratch(str(backup), 1)
    assert not clear_backup_scratch(str(tmp_path / "none"), 1)


def test_progress_lines_round_trip(capsys):
    info = task_info({"KUBETF_ROLE": "worker", "KUBETF_INDEX": "1"})
    emit("progress", info, epoch=2, loss=np.float32(0.5), metrics={"accuracy": np.float64(0.75)}, bad=float("nan"))
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    record = progress_line("worker-1 | " + line)
    assert record == {
        "kubetf": "progress",
        "role": "worker",
        "index": 1,
        "epoch": 2,
        "loss": 0.5,
        "metrics": {"accuracy": 0.75},
        "bad": None,
    }
    assert progress_line("worker-1 | Epoch 1/3") is None


def test_digits_are_in_mnist_layout():
    (x_train, y_train), (x_test, _y_test) = data.digits()
    assert x_train.shape[1:] == (28, 28) and x_train.dtype == np.float32
    assert len(x_train) + len(x_test) == 1797
    assert x_train.min() >= 0.0 and x_train.max() <= 1.0
    assert x_train[:, :4, :].max() == 0.0  # padded like MNIST's 20x20 digits in 28x28
    assert set(np.unique(y_train)) == set(range(10))


def test_auto_data_falls_back_in_one_line_when_mnist_cannot_be_had_and_keeps_to_it(tmp_path, capsys, monkeypatch):
    asked = []

    def unavailable(cache_dir, timeout=20.0):
        asked.append(cache_dir)
        print("Downloading data from https://example.invalid/mnist.npz")
        raise OSError("URL fetch failure: offline")

    monkeypatch.setattr(data, "mnist", unavailable)
    (x_train, y_train), _ = data.load("auto", cache_dir=str(tmp_path))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "MNIST not available" in out[0] and "digits" in out[0]
    assert x_train.shape[1:] == (28, 28)
    # The job's next start (a restart): the same data, MNIST not asked for again
    (again, labels), _ = data.load("auto", cache_dir=str(tmp_path))
    assert len(asked) == 1 and (again == x_train).all() and (labels == y_train).all()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "digits, as this job began with" in out[0]


def test_local_command_mapping_and_checkpoint_dir(tmp_path):
    job = api.with_defaults(
        make_job("m", "MultiWorkerMirrored", {"worker": 2}, ["--epochs", "$(EPOCHS)"], example="mnist_mwms.py")
    )
    container = builders.training_container(job, "worker")
    path_map = local.default_path_map()
    assert path_map == {"/opt/kubetf": str(REPO / "trainer_image")}
    argv = local.container_argv(container, {"EPOCHS": "7"}, path_map, sys.executable)
    assert argv == [sys.executable, str(REPO / "trainer_image/examples/mnist_mwms.py"), "--epochs", "7"]
    assert local._map_path("--data-dir=/opt/kubetf/data", path_map) == f"--data-dir={REPO}/trainer_image/data"
    # mountPath does not exist here: a directory under the workdir
    assert local.checkpoint_dir(job, str(tmp_path)) == os.path.join(str(tmp_path), "checkpoint")
    job["spec"]["checkpoint"]["mountPath"] = str(tmp_path)
    assert local.checkpoint_dir(job, "/elsewhere") == str(tmp_path)


def test_local_env_is_the_operators_env_on_localhost(tmp_path):
    job = make_job("envjob", "ParameterServer", {"chief": 1, "worker": 1, "ps": 1}, [], example="ps_training.py")
    run = local.LocalJob(api.with_defaults(job), str(tmp_path), out=io.StringIO())
    run.prepare()
    env = run.replicas[("worker", 0)].env
    tf_config = json.loads(env["TF_CONFIG"])
    assert tf_config["task"] == {"type": "worker", "index": 0}
    addresses = [a for role in ("chief", "worker", "ps") for a in tf_config["cluster"][role]]
    assert all(a.startswith("localhost:") for a in addresses) and len(set(addresses)) == 3
    assert env["GRPC_FAIL_FAST"] == "use_caller" and env["KUBETF_STRATEGY"] == "ParameterServer"
    assert env["KUBETF_CHECKPOINT_DIR"] == os.path.join(str(tmp_path), "checkpoint")
    assert env["TF_USE_LEGACY_KERAS"] == "1"


def test_local_refuses_an_invalid_job(capsys):
    job = make_job("bad", "MultiWorkerMirrored", {"worker": 2, "ps": 1}, [], example="mnist_mwms.py")
    job["spec"]["strategy"] = "Nope"
    assert local.run_local(job, out=sys.stdout) == 1
    assert "invalid job" in capsys.readouterr().out
