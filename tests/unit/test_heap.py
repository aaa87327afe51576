"""runtime.heap: full collections walk only what is newer than the last one; complete collections reclaim the cycles
among what was frozen."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from kubetf.cluster.workqueue import WorkQueue
from kubetf.runtime.heap import ShortFullCollections, collect_completely
from kubetf.runtime.runner import QUIET_RECONCILES, _quiet

pytestmark = pytest.mark.unit


class Node:
    """A tracked object that can be put in a reference cycle and watched by a weak reference."""

    def __init__(self) -> None:
        self.peer: Node | None = None


def cycle() -> tuple[Node, threading.Event]:
    """A two-object cycle, and an event set when it is reclaimed."""
    first, second = Node(), Node()
    first.peer, second.peer = second, first
    reclaimed = threading.Event()
    weakref.finalize(first, reclaimed.set)
    return first, reclaimed


def walked(obj: object) -> bool:
    """Whether the collector's generations hold `obj` (frozen objects are in none of them)."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture
def heap() -> Iterator[ShortFullCollections]:
    heap = ShortFullCollections(every=3600)
    heap.start()
    yield heap
    heap.stop()


def test_what_survives_a_full_collection_is_walked_by_no_later_one() -> None:
    heap = ShortFullCollections(every=3600)
    heap.start()
    survivor = Node()
    assert walked(survivor)
    gc.collect()
    assert not walked(survivor)
    heap.stop()  # thawed: walked again
    assert walked(survivor)


def test_a_cycle_that_became_garbage_while_frozen_waits_for_a_complete_collection(heap: ShortFullCollections) -> None:
    node, reclaimed = cycle()
    gc.collect()  # survived a full collection: frozen
    del node
    gc.collect()
    assert not reclaimed.is_set()  # full collections no longer see it
    assert collect_completely() >= 2
    assert reclaimed.is_set()


def test_the_complete_collections_come_on_their_own() -> None:
    heap = ShortFullCollections(every=0.05)
    heap.start()
    try:
        node, reclaimed = cycle()
        gc.collect()
        del node
        assert reclaimed.wait(5), "a cycle among frozen objects was not reclaimed by the periodic complete collection"
    finally:
        heap.stop()


def test_a_complete_collection_waits_for_a_quiet_moment() -> None:
    asked = threading.Semaphore(0)
    quiet = threading.Event()

    def is_quiet() -> bool:
        asked.release()
        return quiet.is_set()

    heap = ShortFullCollections(every=1.0, quiet=is_quiet)
    heap.start()
    try:
        node, reclaimed = cycle()
        gc.collect()
        del node
        assert asked.acquire(timeout=5) and asked.acquire(timeout=5), "the reconcilers were never asked"
        assert not reclaimed.is_set(), "a complete collection while the reconcilers were busy"
        quiet.set()
        assert reclaimed.wait(5), "no complete collection once they were quiet"
    finally:
        heap.stop()


def test_every_collection_is_timed_by_generation(heap: ShortFullCollections) -> None:
    def count(generation: str) -> float:
        return REGISTRY.get_sample_value("kubetf_gc_pause_seconds_count", {"generation": generation}) or 0.0

    before = count("2")
    gc.collect()
    gc.collect(0)
    assert count("2") >= before + 1
    assert count("0") >= 1


def test_a_quiet_second_is_one_in_which_few_reconciles_began() -> None:
    queue: WorkQueue[str] = WorkQueue()
    quiet = _quiet(queue)
    for i in range(QUIET_RECONCILES + 1):
        queue.add(f"job-{i}", 2)
        queue.done(queue.get()[0])
    assert not quiet()  # a burst began since the last look
    queue.add("one more", 2)
    queue.done(queue.get()[0])
    assert quiet()
    queue.shutdown()


def test_garbage_that_comes_fast_is_reclaimed_while_it_comes_not_at_the_next_complete_collection() -> None:
    """Short-lived cycles that a full collection froze while they lived (as a flood of connections' once did, a
    million objects within minutes) are reclaimed once what is frozen grew by a quarter, not 10 minutes later."""
    heap = ShortFullCollections(every=3600, min_growth=1000, poll=0.05)
    heap.start()
    try:
        reclaimed = []
        for _ in range(max(100, gc.get_freeze_count() // 200)):
            batch = [cycle() for _ in range(100)]
            gc.collect()  # a full collection while they live: frozen
            reclaimed.extend(done for _, done in batch)
            del batch  # now garbage no full collection sees
        assert reclaimed[0].wait(5), "the frozen garbage was not collected completely as it grew"
    finally:
        heap.stop()
