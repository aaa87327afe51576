"""How a MultiWorkerMirrored task ends its group at once (kubetf_trainer.peers), without TensorFlow: the tokens each
process writes at start, the chief's watch of its peers' tokens, the exit of a process that failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kubetf_trainer import peers
from kubetf_trainer.env import task_info

TRAINER = Path(__file__).resolve().parents[2] / "trainer_image"
CLUSTER = {"worker": ["w0:2222", "w1:2222", "w2:2222"]}


def env(tmp_path: Path, task: str, strategy: str = "MultiWorkerMirrored", **extra: str) -> dict[str, str]:
    role, index = task.split("-")
    tf_config = {"cluster": CLUSTER, "task": {"type": role, "index": int(index)}}
    return {"TF_CONFIG": json.dumps(tf_config), "KUBETF_STRATEGY": strategy, "KUBETF_CHECKPOINT_DIR": str(tmp_path),
            **extra}  # fmt: skip


def test_each_process_of_a_mwms_task_writes_a_token_of_its_own(tmp_path):
    first = peers.announce(env(tmp_path, "worker-1"))
    second = peers.announce(env(tmp_path, "worker-1"))
    assert first and second and first != second
    assert (tmp_path / ".kubetf" / "started" / "worker-1").read_text() == second
    assert peers.announce(env(tmp_path, "worker-2", strategy="ParameterServer")) is None
    assert peers.announce(env(tmp_path, "worker-2", KUBETF_CHECKPOINT_DIR="")) is None  # no shared volume
    assert not (tmp_path / ".kubetf" / "started" / "worker-2").exists()


def test_the_chief_ends_the_group_when_a_peer_restarted_and_only_then(tmp_path):
    for task in ("worker-0", "worker-1", "worker-2"):
        peers.announce(env(tmp_path, task))
    chief = task_info(env(tmp_path, "worker-0"))
    seen: list[str] = []
    restarted = threading.Event()
    assert peers.watch(chief, on_restart=lambda task: (seen.append(task), restarted.set()), every=0.01)
    assert not restarted.wait(0.2)  # tokens unchanged: the group goes on
    peers.announce(env(tmp_path, "worker-2"))  # worker-2's program was started again (in its pod)
    assert restarted.wait(10) and seen == ["worker-2"]


def test_only_the_chief_watches_and_only_tokens_it_can_see(tmp_path):
    for task in ("worker-0", "worker-1", "worker-2"):
        peers.announce(env(tmp_path, task))
    assert not peers.watch(task_info(env(tmp_path, "worker-1")))
    assert not peers.watch(task_info(env(tmp_path / "elsewhere", "worker-0")))  # its own temporary directory


@pytest.mark.parametrize("value,seconds", [("", 3.0), ("1.5", 1.5), ("0", 3.0), ("soon", 3.0)])
def test_the_heartbeat_timeout(value, seconds):
    assert peers.heartbeat_timeout({peers.ENV_HEARTBEAT_TIMEOUT: value}) == seconds


def test_a_failed_process_exits_1_with_its_traceback_and_its_exit_handlers_run_without_the_native_teardown():
    code = (
        "import atexit, sys\n"
        "from kubetf_trainer import peers\n"
        "atexit.register(lambda: print('exit handler ran', flush=True))\n"
        "peers.fail_fast(tell_peers=False)\n"
        "print('buffered, not flushed', end='')\n"
        "raise ValueError('the program failed')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(TRAINER)},
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert "ValueError: the program failed" in result.stderr
    assert result.stdout == "buffered, not flushedexit handler ran\n"
