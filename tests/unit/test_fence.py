"""The checkpoint fence (kubetf_trainer.fence): two runs of one job on one shared checkpoint directory, as two copies
of a MultiKueue job on two workers that share storage are (docs/kueue.md, "The checkpoint"). Real files, real
threads, a lease of a fraction of a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubetf_trainer import fence as fc

LEASE = 1.0  # a beat every 0.083 s: a live task's heartbeat is never a lease late, even on a busy machine


def make(root: Path, run: str, task: str = "worker-0") -> fc.Fence:
    """A task of `run`; what it tells (`notify`) is kept in `.said`."""
    said: list[dict] = []
    fence = fc.Fence(str(root), run, task, job="mnist", lease=LEASE, notify=lambda kind, **f: said.append(f))
    fence.said = said  # type: ignore[attr-defined]
    return fence


def took(fence: fc.Fence) -> dict:
    """What the fence said when it took the directory: from whom and why."""
    return next(f for f in fence.said if f["state"] == "held")  # type: ignore[attr-defined]


class Waiter:
    """`fence.acquire()` in a thread: when it returned, and what it raised."""

    def __init__(self, fence: fc.Fence):
        self.fence, self.at, self.error = fence, None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.fence.acquire()
        except Exception as error:  # what the test looks at
            self.error = error
        self.at = time.monotonic()

    def done(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def silence(fence: fc.Fence) -> None:
    """The task's process stops (SIGKILL, a lost node): no beat, no release."""
    fence._stop.set()
    assert fence._heart is not None
    fence._heart.join()


def test_a_run_takes_a_free_directory_and_its_restarted_tasks_hold_it_at_once(tmp_path):
    first = make(tmp_path, "run-a")
    first.acquire()
    assert first.holder()[0] == 1 and first.holder()[1]["run"] == "run-a"
    first.check()  # its writes go on

    restarted = make(tmp_path, "run-a", "worker-1")  # another task of the run, or the same after a restart
    started = time.monotonic()
    restarted.acquire()
    assert time.monotonic() - started < LEASE / 2
    assert restarted.holder()[0] == 1, "the same run: no new generation"
    for f in (first, restarted):
        f.release()


def test_another_run_waits_while_the_holder_lives_and_takes_over_once_it_released(tmp_path):
    old = make(tmp_path, "old")
    old.acquire()
    new = Waiter(make(tmp_path, "new"))
    assert not new.done(3 * LEASE), "a live holder is never taken over, however long"
    old.check()  # the holder's writes go on meanwhile

    assert [f["state"] for f in new.fence.said] == ["waiting"] and new.fence.said[0]["holder"]["run"] == "old"

    old.release()
    assert new.done(3 * LEASE) and new.error is None
    assert (took(new.fence)["why"], took(new.fence)["before"]["run"]) == ("released", "old"), "not for its silence"
    assert old.holder() == (2, old.holder()[1]) and old.holder()[1]["run"] == "new"
    with pytest.raises(fc.Superseded):
        old.check()  # a write of the old run after its release would be refused
    new.fence.release()


def test_a_holder_that_went_silent_is_taken_over_after_the_lease_not_before(tmp_path):
    old = make(tmp_path, "old")
    old.acquire()
    silence(old)
    silent = time.monotonic()
    new = Waiter(make(tmp_path, "new"))
    assert new.done(3 * LEASE) and new.error is None
    assert new.at - silent >= LEASE, "taken over only after a lease without a beat"
    assert new.fence.holder()[1]["run"] == "new" and took(new.fence)["why"] == "silent"
    new.fence.release()


def test_the_holder_mid_save_when_another_run_arrives_finishes_its_save_before_the_other_writes(tmp_path):
    """The race: a run arrives while the holder is in the middle of a long save. The holder's heartbeat goes on
    beating during the save, so the newcomer waits; it takes over only once the holder released, after the save."""
    old = make(tmp_path, "old")
    old.acquire()
    backup = tmp_path / "backup"
    events: list[tuple[str, float]] = []

    def save_for(seconds: float) -> None:
        old.check()  # the check before the write
        events.append(("old save begins", time.monotonic()))
        with open(backup, "w") as f:  # a save that takes several leases, written in pieces
            for part in range(int(seconds / 0.1)):
                f.write(f"old {part}\n")
                f.flush()
                time.sleep(0.1)
        events.append(("old save ends", time.monotonic()))
        old.release()

    saving = threading.Thread(target=save_for, args=(3 * LEASE,))
    saving.start()
    time.sleep(LEASE / 2)
    new = Waiter(make(tmp_path, "new"))
    assert new.done(8 * LEASE) and new.error is None
    saving.join()
    new.fence.check()
    backup.write_text("new\n")

    assert events[1][0] == "old save ends" and events[1][1] <= new.at, "the newcomer proceeded only after the save"
    assert took(new.fence)["why"] == "released"
    assert backup.read_text() == "new\n", "nothing of the old run's save came after the new run's write"
    new.fence.release()


def test_a_run_that_waited_while_the_holder_finished_the_training_has_nothing_left_to_do(tmp_path):
    old = make(tmp_path, "old")
    old.acquire()
    new = Waiter(make(tmp_path, "new"))
    time.sleep(2 * LEASE)
    old.release(done=True)
    assert new.done(LEASE)
    assert isinstance(new.error, fc.Finished) and new.error.holder["run"] == "old"
    assert new.fence.holder()[1]["run"] == "old", "it took nothing"

    # A run that starts after a finished one (the job made again to train again) takes the directory.
    again = make(tmp_path, "again")
    again.acquire()
    assert again.holder()[1]["run"] == "again"
    again.release()


def test_a_holder_taken_over_while_it_was_frozen_writes_nothing_when_it_comes_back(tmp_path):
    old = make(tmp_path, "old")
    old.acquire()
    old._stop.set()  # frozen (a paused VM, storage away): its heartbeat stops, the process is still there
    assert old._heart is not None
    old._heart.join()
    new = Waiter(make(tmp_path, "new"))
    assert new.done(3 * LEASE) and new.error is None

    with pytest.raises(fc.Superseded) as refused:
        old.check()  # back: its next write is refused
    assert refused.value.holder["run"] == "new"
    new.fence.check()  # and the new holder is not disturbed
    new.fence.release()


def test_only_a_newer_claim_stops_a_holder_not_a_claim_it_cannot_read(tmp_path):
    holder = make(tmp_path, "run-a")
    holder.acquire()
    owner = tmp_path / fc.DIRECTORY / "claims" / "00000001" / "owner"
    owner.write_text("{")  # storage that answered garbage once
    holder.check()
    (tmp_path / fc.DIRECTORY / "claims" / "00000002").mkdir()  # another run takes the next generation
    with pytest.raises(fc.Superseded):
        holder.check()  # even before it wrote its name there
    holder.release()


def test_runs_that_try_to_take_the_next_generation_at_once_end_with_one_holder(tmp_path):
    fences = [make(tmp_path, f"run-{i}") for i in range(8)]
    os.makedirs(fences[0].claims)
    start = threading.Barrier(len(fences))
    took: list[str] = []

    def take(fence: fc.Fence) -> None:
        start.wait()
        if fence._take(1):
            took.append(fence.run)

    threads = [threading.Thread(target=take, args=(f,)) for f in fences]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(took) == 1, took
    assert fences[0].holder()[1]["run"] == took[0]


def test_a_claim_of_a_run_that_died_before_naming_itself_is_taken_after_the_lease(tmp_path):
    (tmp_path / fc.DIRECTORY / "claims" / "00000003").mkdir(parents=True)
    (tmp_path / fc.DIRECTORY / "tasks").mkdir()
    new = Waiter(make(tmp_path, "new"))
    started = time.monotonic()
    assert new.done(3 * LEASE) and new.error is None
    assert new.at - started >= LEASE
    assert new.fence.holder()[0] == 4 and took(new.fence)["why"] == "silent"
    new.fence.release()


def test_the_task_files_say_who_holds_and_who_ended(tmp_path):
    holder = make(tmp_path, "run-a", "chief-0")
    holder.acquire()
    files = tmp_path / fc.DIRECTORY / "tasks"
    beat = json.loads((files / "run-a.chief-0").read_text())
    assert (beat["run"], beat["task"], beat["state"], beat["job"]) == ("run-a", "chief-0", "active", "mnist")
    time.sleep(3 * holder.beat)
    assert json.loads((files / "run-a.chief-0").read_text())["beat"] > beat["beat"]
    holder.release(done=True)
    ended = json.loads((files / "run-a.chief-0").read_text())
    assert (ended["state"], ended["done"]) == ("released", True)
    time.sleep(3 * holder.beat)
    assert json.loads((files / "run-a.chief-0").read_text()) == ended, "no beat after the release"


def test_nothing_is_fenced_outside_a_trainingjobs_pods():
    fc._made, fc._fence = False, None
    try:
        assert fc.current({"KUBETF_CHECKPOINT_DIR": "/ckpt"}) is None  # no run identity (kubetf local)
        fc._made = False
        assert fc.current({"KUBETF_RUN_ID": "uid-1"}) is None  # no checkpoint volume
    finally:
        fc._made, fc._fence = False, None


SUPERSEDED = """
import json, os, sys
from kubetf_trainer import fence
fence.claim()                                   # the directory is free: this run takes it
os.mkdir(os.path.join(sys.argv[1], fence.DIRECTORY, "claims", "00000002"))  # another run takes it over
with open(os.path.join(sys.argv[1], fence.DIRECTORY, "claims", "00000002", "owner"), "w") as f:
    json.dump({"run": "other", "job": "mnist", "host": "worker1"}, f)
fence.check()                                   # the next write: refused
print("wrote after being superseded")
"""


def test_a_superseded_task_exits_42_with_a_line_saying_who_holds_the_directory(tmp_path):
    env = {**os.environ, "KUBETF_RUN_ID": "mine", "KUBETF_CHECKPOINT_DIR": str(tmp_path), "KUBETF_JOB_NAME": "mnist",
           "KUBETF_ROLE": "chief", "KUBETF_INDEX": "0", "KUBETF_CHECKPOINT_LEASE_SECONDS": str(LEASE)}  # fmt: skip
    env.pop("KUBETF_PROGRESS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", SUPERSEDED, str(tmp_path)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == fc.SUPERSEDED_EXIT_CODE, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["kubetf"], r["state"]) for r in lines] == [("fence", "superseded")]  # a free directory: no line
    assert lines[-1]["holder"]["run"] == "other" and lines[-1]["exit_code"] == 42
    assert "wrote after being superseded" not in done.stdout
    assert "run other of job mnist holds the checkpoint directory now" in done.stderr
    ended = json.loads((tmp_path / fc.DIRECTORY / "tasks" / "mine.chief-0").read_text())
    assert ended["state"] == "released"
