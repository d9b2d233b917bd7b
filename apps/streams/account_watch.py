"""The account events of every open socket in this web process, followed once.

Sessions end on logout, a password change or a deactivation (apps/accounts/sessions.py); each
publishes an event naming its user on one stream. One task per process follows that stream
through the output hub (one more stream in its single read, however many sockets are open) and
tells the sockets of the named user; each then re-checks its own session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.exceptions import RedisError

from apps.streams.hub import get_hub, stream_id_key
from contract.cancelling import raise_if_cancelled
from core.redis_client import keys

log = logging.getLogger("sluice.chat.accounts")

RETRY_SECONDS = 1.0

# Called with an event's fields, or with None when events may have been missed (Redis failed).
Listener = Callable[[dict | None], None]


class AccountWatch:
    """Follows one stream of per-user events (`stream_name`); an event whose "user" is "*"
    goes to every listener."""

    def stream_name(self) -> str:
        return keys().account_events

    def __init__(self) -> None:
        self._listeners: dict[str, set[Listener]] = {}
        self._cursor = "0"
        self._task: asyncio.Task | None = None

    def listen(self, user_id: int, listener: Listener, *, after: str) -> Callable[[], None]:
        """Calls `listener` for each account event of `user_id` after event id `after`; returns
        the function that stops it."""
        user = str(user_id)
        self._listeners.setdefault(user, set()).add(listener)
        if self._task is None or self._task.done():
            self._cursor = after
            self._task = asyncio.get_running_loop().create_task(self._run(), name="accounts")
        elif stream_id_key(self._cursor) > stream_id_key(after):
            listener(None)  # events between its `after` and now went by before it listened

        def stop() -> None:
            listeners = self._listeners.get(user)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[user]

        return stop

    async def _run(self) -> None:
        while True:  # for the process's life: one stream in the hub's read, idle or not
            raise_if_cancelled()  # one its Redis client swallowed (contract/cancelling.py)
            try:
                async for batch in get_hub().batches(self.stream_name(), after=self._cursor):
                    self._cursor = batch[-1][0]
                    for _, fields in batch:
                        self._deliver(fields)
            except RedisError as exc:
                log.warning("account events unreadable (%s); retrying", exc)
                await asyncio.sleep(RETRY_SECONDS)
                for listeners in list(self._listeners.values()):  # an event may be lost
                    for listener in list(listeners):
                        listener(None)

    def _deliver(self, fields: dict) -> None:
        user = fields.get("user", "")
        if user == "*":
            chosen = [listener for listeners in self._listeners.values() for listener in listeners]
        else:
            chosen = list(self._listeners.get(user, ()))
        for listener in chosen:
            listener(fields)


_watches: dict[tuple[int, type], AccountWatch] = {}


def get_account_watch(kind: type[AccountWatch] = AccountWatch) -> AccountWatch:
    """The process's watch of that kind for the running event loop (daphne runs one loop per
    process)."""
    loop = asyncio.get_running_loop()
    watch = _watches.get((id(loop), kind))
    if watch is None:
        watch = _watches[(id(loop), kind)] = kind()
    return watch
