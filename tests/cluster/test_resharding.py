"""A slot moved from one master to another while readers wait on it (CLUSTER SETSLOT IMPORTING /
MIGRATING, MIGRATE, SETSLOT NODE: what `redis-cli --cluster reshard` does), with text written
at every step: the output hub follows the slot to its new master and every reader sees every
event once. Then the same for the dispatcher's own slot under load: every request still ends
once."""

from __future__ import annotations

import asyncio
import time

from django.conf import settings

from apps.streams.cluster_hub import ClusterOutputHub
from contract import cluster
from contract.protocol import Keys
from core.redis_client import keys
from devstack.cluster import SlotMove
from tests.faults.conftest import assert_every_request_ended


def _client(**options):
    return cluster.sync_client(
        settings.REDIS_URL,
        decode_responses=True,
        max_connections=4,
        timeout=5,
        connect_timeout=2,
        **options,
    )


async def _read_all(hub, stream: str) -> list[str]:
    return [fields["text"] async for _, fields in hub.events(stream)]


async def test_readers_follow_an_output_stream_resharded_mid_answer(redis_prefix):
    writer = cluster.async_client(
        settings.REDIS_URL, decode_responses=True, socket_timeout=5, connect_timeout=2
    )
    hub = ClusterOutputHub(settings.REDIS_URL, name=f"hub-reshard-{redis_prefix}", block_ms=1000)
    moving = keys().output("reshard-me")  # a live request's output stream...
    state = keys().request("reshard-me")  # ...and its state hash: the same slot
    staying = [keys().output(f"stay-{i}") for i in range(20)]  # elsewhere in the cluster
    admin = _client()
    slot = admin.keyslot(moving)
    assert admin.keyslot(state) == slot
    move = SlotMove(admin, slot)
    source, target = move.source_name, move.target_name
    await writer.hset(state, mapping={"state": "streaming"})
    written: list[str] = []

    async def write(count: int) -> None:
        for _ in range(count):
            text = str(len(written))
            for stream in (moving, *staying):
                await writer.xadd(stream, {"type": "delta", "text": text})
            written.append(text)
            await asyncio.sleep(0.02)

    await write(3)  # text before the readers came
    readers = [asyncio.create_task(_read_all(hub, s)) for s in (moving, moving, *staying)]
    await write(3)
    assert hub._owner.get(moving) == source
    await asyncio.to_thread(move.begin)  # MIGRATING: the source still serves the stream
    await write(3)
    assert await asyncio.to_thread(move.migrate_keys) == 2  # now the source answers ASK
    await write(3)
    await asyncio.to_thread(move.finish)  # and from here MOVED
    await write(3)
    for _ in range(100):  # the next read meets MOVED (or the next full read regroups)
        if hub._owner.get(moving) == target:
            break
        await asyncio.sleep(0.05)
    assert hub._owner.get(moving) == target  # its subscription moved to the new owner
    await write(3)
    for stream in (moving, *staying):
        await writer.xadd(stream, {"type": "final", "text": "end"})
    results = await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
    assert all(result == [*written, "end"] for result in results), results
    assert _client().get_node_from_key(moving).name == target
    assert await writer.hget(state, "state") == "streaming"  # moved with it
    move.close()
    admin.close()
    await writer.aclose()


def test_the_dispatchers_slot_resharded_under_load_strands_nothing(
    cluster_stack, roomy_plan, make_api
):
    """The slot of the dispatcher's keys (admission, queue, buckets, work streams) moves while
    requests arrive: redis-py follows ASK/MOVED and retries TRYAGAIN, and every accepted request
    still ends exactly once, stored once."""
    stack = cluster_stack
    base = stack.up({"w1": 4, "w2": 4})
    api = make_api("alice", base)
    prefix = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    ids = [api.submit() for _ in range(8)]
    admin = _client()
    move = SlotMove(admin, admin.keyslot(prefix.admit))
    move.begin()
    ids += [api.submit() for _ in range(4)]
    move.migrate_keys()
    ids += [api.submit() for _ in range(4)]
    move.finish()
    time.sleep(0.5)
    ids += [api.submit() for _ in range(4)]
    assert all(ids)
    ended = assert_every_request_ended(api, stack, ids, timeout=120)
    assert set(ended.values()) == {"done"}, ended
    assert _client().get_node_from_key(prefix.admit).port == move.target_address[1]
    for name in ("web", "dispatcher", "w1", "w2"):
        assert stack.processes[name].poll() is None, stack.log(name)
    move.close()
    admin.close()
