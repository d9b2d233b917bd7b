"""Work left under the fleet's old key names moves to the current ones when a worker starts.

The work streams and the dead-letter stream were renamed when the fleet's keys moved under one
hash tag for Redis Cluster (`keys.FLEET_TAG`). A Redis upgraded from a release before that can
still hold entries under the old names: work that was waiting or running when the old workers
stopped, and dead letters an operator has not read. The first worker of this release to start
moves them, one worker at a time (a lock), and deletes each old entry after copying it:

- work entries go to their model's shared stream, marked as returned (not a first delivery); a
  request whose attempt was running on an old worker is found suspect and runs alone
  (isolation.py), like any work of a worker that died;
- dead letters go to the current dead-letter stream, unchanged.

Each entry is copied, then deleted; a worker that dies between the two leaves a copy behind,
which the next start copies again. A second copy of a work entry is harmless: a request is
started, fenced and ended once (transitions.py), and the later copy finds it ended. Heartbeats
and the workers' set under the old names expire or are ignored: nothing to move.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from contract import protocol
from contract.keys import Keys

log = logging.getLogger("sluice.worker.legacy")

PAGE = 200
LOCK_SECONDS = 60


async def move_legacy_entries(client, keys: Keys) -> int:
    """Moves what the old names hold; returns how many entries moved (0 when another worker
    holds the lock, or nothing was left). Never raises for Redis trouble: logged instead."""
    try:
        if not await client.set(keys.legacy_move_lock, "1", nx=True, ex=LOCK_SECONDS):
            return 0
        try:
            moved = 0
            for stream in await _legacy_work_streams(client, keys):
                moved += await _move(client, stream, keys, work=True)
            if await client.type(keys.legacy_dead) == "stream":
                moved += await _move(client, keys.legacy_dead, keys, work=False)
            if moved:
                log.warning("moved %d entries from the fleet's old key names", moved)
            return moved
        finally:
            await client.delete(keys.legacy_move_lock)
    except RedisError as exc:  # the next worker to start tries again
        log.warning("could not move entries from the old key names: %s", exc)
        return 0


async def _legacy_work_streams(client, keys: Keys) -> list[str]:
    streams = [keys.legacy_work] if await client.type(keys.legacy_work) == "stream" else []
    async for name in client.scan_iter(match=keys.legacy_work_pattern, _type="stream"):
        streams.append(name)
    return streams


async def _move(client, stream: str, keys: Keys, *, work: bool) -> int:
    moved = 0
    while True:
        entries = await client.xrange(stream, count=PAGE)
        if not entries:
            break
        for entry_id, fields in entries:
            if fields and work:  # no longer a first delivery
                target = keys.work_for_model(fields.get("model", ""))
                await client.xadd(target, {**fields, protocol.RETURNED: "1"})
            elif fields:
                await client.xadd(keys.dead, fields, maxlen=protocol.DEAD_MAXLEN)
            moved += bool(fields)
            await client.xdel(stream, entry_id)
    await client.delete(stream)
    return moved
