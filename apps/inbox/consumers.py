"""The inbox's websocket (/ws/inbox/), one per open page: the user's unread messages when it
opens, then new ones live, without the user sending anything.

Frames to the page: {"type": "inbox", "messages": [...]} (see inbox.inbox_frame). From the
page: {"type": "read", "ids": [...]} once it has shown them. Like the chat socket it lives only
as long as its login session (code 4401 when that ends).
"""

from __future__ import annotations

import asyncio
import json
import logging

import orjson
from redis.exceptions import RedisError

from apps.accounts.sessions import AccountEvent, SessionEnded, session_digest
from apps.accounts.socket_login import SocketLogin
from apps.inbox import services as inbox
from apps.streams.account_watch import AccountWatch, get_account_watch
from apps.streams.offload import db_call
from apps.streams.pooled_consumer import PooledConsumer

log = logging.getLogger("sluice.chat.inbox")

SESSION_ENDED_CODE = 4401
SESSION_EVENTS = {AccountEvent.LOGOUT, AccountEvent.CREDENTIALS, AccountEvent.DELETED}
MAX_FRAME_BYTES = 16 * 1024


class InboxWatch(AccountWatch):
    """The inbox-events stream, followed once per process for every open inbox socket."""

    def stream_name(self) -> str:
        return inbox.inbox_events_key()


class InboxConsumer(PooledConsumer):
    stop_listening = ()
    ended = False

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=SESSION_ENDED_CODE)
            return
        login: SocketLogin = self.scope["login"]  # its check passed as the socket opened
        self.session = login.session
        self.session_digest = session_digest(self.session.session_key)
        self._tasks: set[asyncio.Task] = set()
        self.delivered = 0  # the newest message id sent, so a re-read sends only newer ones
        # one re-read at a time: two at once (announcements sent close together) would both read
        # after the same id and send the same messages twice
        self._rereading = asyncio.Lock()
        unread, inbox_after = await self._open()
        accounts_after = login.events_after
        await self.accept()
        self.stop_listening = (
            get_account_watch(InboxWatch).listen(
                self.user.pk, self._inbox_event, after=inbox_after
            ),
            get_account_watch().listen(self.user.pk, self._account_event, after=accounts_after),
        )
        await self._deliver(unread)

    async def disconnect(self, code: int) -> None:
        for stop in self.stop_listening:
            stop()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        if self.ended:
            return
        try:
            frame = orjson.loads(text_data or "") if len(text_data or "") <= MAX_FRAME_BYTES else {}
        except orjson.JSONDecodeError:
            frame = {}
        if not isinstance(frame, dict) or frame.get("type") != "read":
            await self.send(
                text_data=json.dumps({"type": "error", "message": "Unknown inbox frame."})
            )
            return
        ids = frame.get("ids")
        try:
            await self._mark_read(ids if isinstance(ids, list) else [])
        except SessionEnded:
            await self._end_session()

    # -- live events -----------------------------------------------------------------------------

    def _inbox_event(self, fields: dict | None) -> None:
        """A message for this user (its frame in the event), or one for everyone (an
        announcement: the user's own unread messages are read again), or None when events may
        have been missed."""
        if self.ended:
            return
        if fields is not None and fields.get("message"):
            try:
                message = json.loads(fields["message"])
            except ValueError:
                return
            self._spawn(self._deliver_frames([message]))
        else:
            self._spawn(self._reread())

    def _account_event(self, fields: dict | None) -> None:
        """A session event re-checks the session; other events on that stream (tabs kept in
        step) are not this socket's business."""
        if self.ended or (fields is not None and fields.get("type") not in SESSION_EVENTS):
            return
        if fields is not None and fields.get("session") == self.session_digest:
            self._spawn(self._end_session())
        else:
            self._spawn(self._recheck())

    def _spawn(self, coroutine) -> None:
        """Runs `coroutine` on the socket's loop, holding it until it ends (an event listener
        is called synchronously, from the watch's task)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reread(self) -> None:
        try:
            async with self._rereading:
                await self._deliver(await self._unread_after(self.delivered))
        except SessionEnded:
            await self._end_session()
        except Exception as exc:  # the database is away: the next visit shows them
            log.warning("inbox of user %s not read: %s", self.user.pk, exc)

    async def _recheck(self) -> None:
        try:
            await db_call(self._require_session)()
        except SessionEnded:
            await self._end_session()
        except Exception as exc:  # unknown while the database is away; read frames check again
            log.warning("session of user %s not checked: %s", self.user.pk, exc)

    async def _deliver(self, messages) -> None:
        await self._deliver_frames([inbox.inbox_frame(m) for m in messages])

    async def _deliver_frames(self, frames: list[dict]) -> None:
        if frames and not self.ended:
            self.delivered = max([self.delivered, *(f["id"] for f in frames)])
            await self.send(text_data=json.dumps({"type": "inbox", "messages": frames}))

    async def _end_session(self) -> None:
        if not self.ended:
            self.ended = True
            for stop in self.stop_listening:
                stop()
            await self.close(code=SESSION_ENDED_CODE)

    # -- database --------------------------------------------------------------------------------

    def _require_session(self) -> None:
        self.session.require()

    @db_call
    def _open(self):
        """Unread messages and the id to follow the inbox's events after, read before the
        messages so nothing published in between goes unseen (the page drops repeats). The
        login checked the session just before."""
        try:
            inbox_after = inbox.inbox_events_last_id()
        except RedisError:
            inbox_after = "0"
        return inbox.inbox_unread_for_user(user_id=self.user.pk), inbox_after

    @db_call
    def _unread_after(self, after_id: int):
        self._require_session()
        return inbox.inbox_unread_for_user(user_id=self.user.pk, after_id=after_id)

    @db_call
    def _mark_read(self, ids: list) -> int:
        self._require_session()
        return inbox.inbox_mark_read(user_id=self.user.pk, ids=ids)
