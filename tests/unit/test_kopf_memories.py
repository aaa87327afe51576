"""kopf keeps nothing per watched object for the operator (kubetf.runtime.handlers.NoMemories): its memories are
for handler kinds kubetf does not use, and they cost about 5 KB per job at scale. NoMemories subclasses a class of
kopf's private inventory module, so these tests are what tells a kopf upgrade that changed it."""

import asyncio
import inspect

import kopf
import pytest

from kubetf.runtime.handlers import NoMemories

pytestmark = pytest.mark.unit


def pod(uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": f"p-{uid}", "uid": uid}}


def test_no_memory_outlives_its_event():
    memories = NoMemories()

    async def twice() -> tuple[object, object]:
        first = await memories.recall(pod("a"), noticed_by_listing=True)
        again = await memories.recall(pod("a"))
        await memories.forget(pod("a"))  # a DELETED event: nothing to forget, and no error
        return first, again

    first, again = asyncio.run(twice())
    assert first is not again  # kopf's own ResourceMemories returns the one it keeps
    assert first.noticed_by_listing and not again.noticed_by_listing


def test_kopf_run_takes_the_memories():
    assert "memories" in inspect.signature(kopf.run).parameters
