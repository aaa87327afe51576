import threading
import time

from kubetf import handlers


def test_merge_patch_turns_old_into_new():
    old = {"phase": "Restarting", "restartAfter": "t", "restarts": {"failures": 1, "total": 1}, "tasks": {"w-0": 1}}
    new = {"phase": "Running", "restarts": {"failures": 1, "total": 2}, "tasks": {"w-0": 1}, "ready": "1/1"}
    assert handlers.merge_patch(old, new) == {
        "restartAfter": None,
        "phase": "Running",
        "restarts": {"total": 2},
        "ready": "1/1",
    }


def test_coalescer_runs_one_reconcile_per_job_at_a_time_and_once_more_after_requests():
    calls = []
    inside = threading.Event()
    release = threading.Event()

    def work(key):
        calls.append(key)
        if len(calls) == 1:
            inside.set()
            release.wait(5)

    coalescer = handlers.Coalescer(work)
    first = threading.Thread(target=coalescer.request, args=(("ns", "a"),))
    first.start()
    inside.wait(5)
    for _ in range(5):  # requests while the first run is going: coalesced into one more run
        coalescer.request(("ns", "a"))
    release.set()
    first.join(5)
    assert calls == [("ns", "a"), ("ns", "a")]


def test_scheduler_fires_at_the_earliest_requested_time():
    fired = []
    done = threading.Event()
    scheduler = handlers.Scheduler()
    scheduler.start(lambda key: (fired.append((key, time.monotonic())), done.set()))
    start = time.monotonic()
    scheduler.at(time.time() + 5, ("ns", "a"))
    scheduler.at(time.time() + 0.2, ("ns", "a"))
    assert done.wait(3)
    key, when = fired[0]
    assert key == ("ns", "a")
    assert 0.15 < when - start < 1.0
