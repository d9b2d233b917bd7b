"""An SSE stream ends with the login that opened it, as a websocket does.

A stream is authorised once, when it opens; it may then run for minutes. Logout, a password
change, a deactivation or an API key's revocation each publish an account event naming the
user (apps/accounts/signals.py); a stream of that user re-checks the credential it was opened
with (the session, or the key) and, if it no longer stands, sends `session_ended` and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from apps.accounts.services import api_key_authenticate
from apps.accounts.sessions import AccountEvent, SessionCheck, session_digest
from apps.streams.account_watch import get_account_watch
from core.account_events import events_last_id

SESSION_EVENTS = {
    AccountEvent.LOGOUT,
    AccountEvent.CREDENTIALS,
    AccountEvent.DELETED,
    AccountEvent.KEY_REVOKED,
}
ENDED_FRAME = b'event: session_ended\ndata: {"type": "session_ended"}\n\n'


class StreamLogin:
    """The credential a stream was opened with: an API key (`raw_key`) or a session."""

    def __init__(self, *, user_id: int, raw_key: str | None, session_key: str | None) -> None:
        self.user_id = user_id
        self.raw_key = raw_key
        self.session_key = session_key
        self.session_digest = session_digest(session_key) if raw_key is None else None

    def ended_by(self, fields: dict) -> bool:
        """The event names this stream's own session as logged out: it ends at once (the
        logout is announced before Django flushes the session, so a re-check could still
        find it)."""
        return (
            self.session_digest is not None
            and fields.get("type") == AccountEvent.LOGOUT
            and fields.get("session") == self.session_digest
        )

    def stands(self) -> bool:
        """Whether the credential still logs the user in (one query; the connection goes back
        to the pool at once, as the stream holds none)."""
        try:
            if self.raw_key is not None:
                user = api_key_authenticate(raw=self.raw_key)
                return user is not None and user.pk == self.user_id
            return SessionCheck(session_key=self.session_key, user_id=self.user_id).current()
        finally:
            close_old_connections()


async def until_login_ends(
    login: StreamLogin, frames: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """`frames` as they come, until they end or the login does (then `session_ended`)."""
    ended = asyncio.Event()
    checks: set[asyncio.Task] = set()

    async def recheck() -> None:
        if not await sync_to_async(login.stands, thread_sensitive=False)():
            ended.set()

    def on_account_event(fields: dict | None) -> None:  # None: events may have been missed
        if fields is not None and fields.get("type") not in SESSION_EVENTS:
            return  # a conversation changed in another tab: nothing to re-check
        if fields is not None and login.ended_by(fields):
            ended.set()
            return
        task = asyncio.get_running_loop().create_task(recheck())
        checks.add(task)
        task.add_done_callback(checks.discard)

    after = await sync_to_async(events_last_id, thread_sensitive=False)()
    stop_listening = get_account_watch().listen(login.user_id, on_account_event, after=after)
    ending = asyncio.ensure_future(ended.wait())
    following: asyncio.Future | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(frames))
            done, _ = await asyncio.wait({following, ending}, return_when=asyncio.FIRST_COMPLETED)
            if following not in done:
                yield ENDED_FRAME
                return
            try:
                frame = following.result()
            except StopAsyncIteration:
                return
            following = None
            yield frame
    finally:
        stop_listening()
        ending.cancel()
        for task in list(checks):
            task.cancel()
        if following is not None and not following.done():  # the reader is gone, or ended
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await following
        await frames.aclose()
