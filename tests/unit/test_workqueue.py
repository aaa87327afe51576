"""The generic machinery: the work queue and expectations."""

import threading
import time

import pytest

from kubetf.cluster.workqueue import Expectations, ShutDown, WorkQueue
from tests.cluster.fixture import wait_for

pytestmark = pytest.mark.unit


def test_most_urgent_first_fifo_within_a_priority_and_each_key_once():
    queue = WorkQueue()
    queue.add("resync", 2)
    queue.add("new-a", 1)
    queue.add("new-b", 1)
    queue.add("ended", 0)
    queue.add("new-a", 1)  # already queued: no second entry
    queue.add("resync", 0)  # asked for again, more urgently: moves up, keeps one entry
    order = []
    while len(queue):
        key, priority = queue.get()
        order.append((key, priority))
        queue.done(key)
    assert order == [("ended", 0), ("resync", 0), ("new-a", 1), ("new-b", 1)]


def test_waiting_counts_the_keys_queued_up_to_a_priority_but_the_one_asking():
    queue = WorkQueue()
    queue.add("new-a", 2)
    assert not queue.waiting(2, besides="new-a")
    queue.add("report-b", 3)
    assert not queue.waiting(2, besides="new-a")
    queue.add("report-b", 1)  # moved up
    assert queue.waiting(2, besides="new-a") and not queue.waiting(0, besides="new-a")
    assert queue.get() == ("report-b", 1)
    assert queue.waiting(2, besides="x") and not queue.waiting(2, besides="new-a")
    queue.get()
    assert not queue.waiting(3, besides="x")


def test_a_wakeup_taken_back_never_comes_and_another_is_not_taken_back():
    now = [100.0]
    queue = WorkQueue(clock=lambda: now[0])
    queue.at(110.0, "job", 2)
    queue.at(105.0, "other", 2)
    queue.cancel_at("job", 2, 110.0)
    queue.cancel_at("other", 2, 104.0)  # not the one due: stays
    now[0] = 111.0
    with queue.timer_cond:
        queue.timer_cond.notify()
    assert wait_for(lambda: len(queue) == 1, 5, "the other's wakeup")
    assert queue.get() == ("other", 2)
    assert len(queue) == 0


def test_a_key_is_never_processed_twice_at_once_and_comes_back_once_if_added_meanwhile():
    queue = WorkQueue()
    queue.add("job", 1)
    key, _ = queue.get()
    for _ in range(3):
        queue.add("job", 1)  # while it is processed
    assert len(queue) == 0
    queue.done(key)
    assert len(queue) == 1
    assert queue.get() == ("job", 1)


def test_wakeups_fire_at_the_earliest_time_asked():
    queue = WorkQueue()
    start = time.time()
    queue.at(start + 5, "job", 1)
    queue.at(start + 0.2, "job", 1)
    key, _ = queue.get()
    assert key == "job"
    assert 0.15 < time.time() - start < 2


def test_retry_backs_off_per_key_doubling_until_forgotten():
    now = [100.0]
    queue = WorkQueue(backoff_first=1, backoff_cap=5, clock=lambda: now[0])
    assert [queue.retry("job", 1) for _ in range(5)] == [1, 2, 4, 5, 5]
    assert queue.retry("other", 1) == 1
    queue.forget("job")
    assert queue.retry("job", 1) == 1


def test_shutdown_releases_waiting_workers():
    queue = WorkQueue()
    stopped = threading.Event()

    def worker():
        try:
            queue.get()
        except ShutDown:
            stopped.set()

    threading.Thread(target=worker, daemon=True).start()
    queue.shutdown()
    assert stopped.wait(2)


def test_a_reserved_worker_takes_only_urgent_keys_while_the_others_are_busy():
    queue = WorkQueue()
    queue.add("busy", 2)
    assert queue.get() == ("busy", 2)  # the only general worker is busy with it
    taken: list[tuple[str, int]] = []
    urgent_taken = threading.Event()

    def reserved_worker():
        try:
            while True:
                key, priority = queue.get(most=0)
                taken.append((key, priority))
                queue.done(key)
                urgent_taken.set()
        except ShutDown:
            return

    threading.Thread(target=reserved_worker, daemon=True).start()
    queue.add("new job", 2)
    queue.add("preempted", 0)
    assert urgent_taken.wait(2), "the reserved worker was not woken by an urgent key"
    assert taken == [("preempted", 0)]
    queue.done("busy")
    assert len(queue) == 1
    assert queue.get() == ("new job", 2)  # left for a general worker
    queue.add("busy", 0)  # its next disruption: the reserved worker takes it too
    urgent_taken.clear()
    assert urgent_taken.wait(2)
    assert taken == [("preempted", 0), ("busy", 0)]
    queue.shutdown()


def test_expectations_are_met_by_what_the_watch_shows():
    now = [0.0]
    expectations = Expectations(timeout=30, clock=lambda: now[0])
    expectations.expect("job", creations=["w-0", "w-1"], deletions=["uid-old"])
    assert expectations.defer("job", 1) == 30
    assert expectations.defer("job", 0) == 30
    assert expectations.observe("job", "w-0", "uid-1", gone=False) is None
    assert expectations.observe("job", "old", "uid-old", gone=True) is None
    assert expectations.observe("job", "w-1", "uid-2", gone=False) == 0  # the last one: deferred, most urgent
    assert expectations.defer("job", 1) is None


def test_refused_creates_are_not_waited_for_and_lost_events_expire():
    now = [0.0]
    expectations = Expectations(timeout=30, clock=lambda: now[0])
    expectations.expect("job", creations=["w-0", "w-1"])
    expectations.cancel_creations("job", ["w-1"])
    expectations.observe("job", "w-0", "uid", gone=False)
    assert expectations.defer("job", 1) is None
    expectations.expect("job", creations=["w-2"])
    now[0] = 29.9
    assert expectations.defer("job", 1) == 30
    now[0] = 30
    assert expectations.defer("job", 1) is None
    assert expectations.observe("job", "w-2", "uid", gone=False) is None  # expired: nothing deferred is handed back


def test_worker_threads_are_woken_by_adds_and_by_due_timers():
    queue = WorkQueue()
    handled = []
    done = threading.Event()

    def worker():
        while True:
            try:
                key, _ = queue.get()
            except ShutDown:
                return
            handled.append(key)
            queue.done(key)
            if len(handled) == 3:
                done.set()

    for _ in range(3):
        threading.Thread(target=worker, daemon=True).start()
    time.sleep(0.1)  # every worker and the timer thread are waiting
    queue.add("a", 1)
    queue.add("b", 1)
    queue.at(time.time() + 0.1, "c", 2)
    assert done.wait(3), handled
    queue.shutdown()


def test_a_keys_wait_for_a_worker_is_reported_at_the_priority_it_is_handed_out_at():
    now = [100.0]
    waits = []
    queue = WorkQueue(clock=lambda: now[0], on_wait=lambda priority, seconds: waits.append((priority, seconds)))
    queue.add("job", 1)
    now[0] += 2
    queue.add("job", 0)  # asked for again, more urgently: its urgent wait starts
    now[0] += 1
    assert queue.get() == ("job", 0)
    queue.done("job")
    queue.add("job", 1)
    now[0] += 4
    assert queue.get() == ("job", 1)
    assert waits == [(0, 1.0), (1, 4.0)]
    queue.shutdown()


def test_the_keys_handed_out_are_counted():
    queue = WorkQueue()
    queue.add("a", 2)
    queue.add("a", 0)  # once, at its most urgent
    queue.add("b", 2)
    assert queue.handed_out() == 0
    assert queue.get() == ("a", 0)
    assert queue.get() == ("b", 2)
    assert queue.handed_out() == 2
    queue.shutdown()
