"""The chat page's websocket: send, stop, regenerate, and the answer streamed back live.

Frames from the browser are JSON: {"type": "send", "text": ...}, {"type": "stop"},
{"type": "regenerate"}, {"type": "continue"} (an answer cut short goes on),
{"type": "resume", "request_id": ..., "last_event_id": ...},
{"type": "edit", "message_id": ..., "text": ...} (turns.py: the old branch is discarded). A page
that reconnects names the answer it was following and the last event it saw in the socket's
query string (`?resume=<request id>&after=<event id>`), so the answer continues where it was.
Frames to the browser: "request" (a request started), "user_message", "status" (queued,
position, ETA), "start" (an attempt began: drop partial text), "delta", "final" (sanitised
HTML of the whole answer), "error" (a problem with the last frame; the socket stays open),
and from the user's other tabs (tab_sync.py): "conversation" (a question, title or deletion in
any of the user's conversations) and "truncate" (an edit removed messages from the page).

The socket lives only as long as the login session that opened it: it follows the user's
account events (apps/accounts/sessions.py) and closes with code 4401 when its session ends, and
every frame re-checks the session before anything is stored or answered.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs

import orjson
from django.db import InterfaceError, OperationalError
from django.http import Http404
from django.utils.html import escape, linebreaks
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from apps.accounts.sessions import SessionEnded, session_digest
from apps.accounts.socket_login import SocketLogin
from apps.chat import selectors, services, submission, tab_sync, turns
from apps.chat.models import Conversation
from apps.streams.account_watch import get_account_watch
from apps.streams.frames import EVENT_ID, frames_for_batch
from apps.streams.hub import get_hub
from apps.streams.hub_base import Entry
from apps.streams.offload import db_call
from apps.streams.pooled_consumer import PooledConsumer
from contract import protocol
from contract.cancelling import cancel_and_wait
from core.redis_client import keys

log = logging.getLogger("sluice.chat.ws")

MAX_FRAME_BYTES = 64 * 1024
SESSION_ENDED_CODE = 4401
# A frame that fails because PostgreSQL or Redis cannot be reached gets an error reply and the
# socket stays open, as an HTTP request gets a 503 (core/errors.py).
OUTAGES = (OperationalError, InterfaceError, RedisConnectionError, RedisTimeoutError)
OUTAGE_MESSAGE = "Sluice cannot reach its database or queue right now. Please try again shortly."


class ChatConsumer(PooledConsumer):
    relay: asyncio.Task | None = None
    following: str | None = None  # the request the relay follows
    session_watch: asyncio.Task | None = None
    stop_listening = None  # stops the account events of this socket's user
    ended = False

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=4401)
            return
        login: SocketLogin = self.scope["login"]  # its check passed as the socket opened
        self.session = login.session
        self.session_digest = session_digest(self.session.session_key)
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        try:
            self.conversation, active = await self._open(conversation_id)
        except Http404:
            await self.close(code=4404)
            return
        await self.accept()
        self.stop_listening = get_account_watch().listen(
            self.user.pk, self._account_event, after=login.events_after
        )
        if active:
            await self._follow(active, after=self._resume_point(active))

    def _resume_point(self, active: str) -> str:
        """Where to follow the answer in progress from: after the last event the page saw when
        it reconnects (`?resume=<request id>&after=<event id>`), else from its start."""
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        after = (query.get("after") or [""])[0]
        if (query.get("resume") or [""])[0] == active and EVENT_ID.fullmatch(after):
            return after
        return "0"

    async def disconnect(self, code: int) -> None:
        if self.stop_listening is not None:
            self.stop_listening()
        for task in (self.relay, self.session_watch):
            if task is not None and task is not asyncio.current_task():
                await cancel_and_wait(task)

    # -- frames from the browser ---------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        if self.ended:
            return  # sent before the client saw the close
        try:
            await self._receive(text_data)
        except SessionEnded:
            await self._end_session()
        except OUTAGES as exc:
            log.warning("websocket frame failed: %s: %s", type(exc).__name__, exc)
            reply = {"type": "error", "message": OUTAGE_MESSAGE}
            draft = _draft_of(text_data)
            if draft is not None:
                reply["draft"] = draft  # nothing typed is lost
            await self._send(reply)

    async def _receive(self, text_data: str | None) -> None:
        if text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self._refuse("That message could not be read (send JSON text under 64 KB).")
            return
        try:
            # Strict JSON: a lone UTF-16 surrogate escape is text no database or model takes.
            frame = orjson.loads(text_data)
        except orjson.JSONDecodeError as exc:
            await self._refuse(f"That message could not be read (malformed JSON: {exc}).")
            return
        try:
            kind = frame["type"]
        except (KeyError, TypeError):
            await self._refuse("That message could not be read (malformed JSON).")
            return
        handler = {
            "send": self._on_send,
            "stop": self._on_stop,
            "regenerate": self._on_regenerate,
            "continue": self._on_regenerate,  # an answer cut short goes on (turns.py)
            "resume": self._on_resume,
            "edit": self._on_edit,
        }.get(kind)
        if handler is None:
            await self._refuse(f"Unknown action {str(kind)[:40]!r}.")
            return
        await handler(frame)

    async def _on_send(self, frame: dict) -> None:
        text = frame.get("text")
        if not isinstance(text, str):
            await self._refuse("Type a message first.")
            return
        # Followed before the question is published to the user's tabs, so that this socket
        # takes the event as its own whenever it arrives.
        self.following = request_id = protocol.new_request_id()
        try:
            submitted = await self._submit(text, request_id)
        except submission.REFUSALS as exc:
            await self._refused(exc, draft=text)
            return
        await self._asked(submitted)

    async def _on_edit(self, frame: dict) -> None:
        text, message_id = frame.get("text"), frame.get("message_id")
        if not isinstance(text, str) or not isinstance(message_id, int):
            await self._refuse("That edit could not be read.")
            return
        previous, self.following = self.following, protocol.new_request_id()
        request_id = self.following
        try:
            submitted, removed = await db_call(self._in_session)(
                turns.message_edit,
                user=self.user,
                conversation=self.conversation,
                message_id=message_id,
                text=text,
                request_id=request_id,
            )
        except submission.REFUSALS as exc:
            self.following = previous
            await self._refused(exc)
            return
        await self._send({"type": "truncate", "from_message_id": removed})
        await self._asked(submitted)

    async def _asked(self, submitted: submission.Submitted) -> None:
        """Shows the question and follows its answer (the submit told the user's other tabs)."""
        message = submitted.user_message
        await self._send(
            {"type": "user_message", "id": message.id, "html": linebreaks(escape(message.text))}
        )
        await self._started(submitted.request_id, written=submitted.first_event)

    async def _on_regenerate(self, frame: dict) -> None:
        again = frame["type"] == "regenerate"
        service = turns.answer_regenerate if again else turns.answer_continue
        previous, self.following = self.following, protocol.new_request_id()
        try:
            submitted = await db_call(self._in_session)(
                service, user=self.user, conversation=self.conversation, request_id=self.following
            )
        except submission.REFUSALS as exc:
            self.following = previous
            await self._refused(exc)
            return
        if again:
            await self._send({"type": "regenerating"})
        await self._started(submitted.request_id, written=submitted.first_event)

    async def _refused(self, exc: Exception, *, draft: str | None = None) -> None:
        """A refused submit, told as every way in tells it; the composer gets its text back
        when nothing was stored."""
        refusal = submission.refusal_of(exc)
        if refusal.draft_kept and draft is not None:
            await self._send({"type": "error", "message": refusal.message, "draft": draft})
        else:
            await self._error(refusal.message)

    async def _on_stop(self, frame: dict) -> None:
        try:
            stopped = await self._stop(frame.get("request_id"))
        except Http404:
            await self._error("That answer was not found.")
            return
        if not stopped:
            await self._error("Nothing is being generated.")

    async def _on_resume(self, frame: dict) -> None:
        request_id = frame.get("request_id")
        after = frame.get("last_event_id") or "0"
        if not isinstance(request_id, str) or not isinstance(after, str):
            await self._refuse("That answer was not found.")
            return
        try:
            info = await db_call(self._in_session)(
                selectors.request_get_for_user, user=self.user, request_id=request_id
            )
        except Http404:
            await self._error("That answer was not found.")
            return
        if info.conversation_id != self.conversation.id:
            await self._error("That answer was not found.")
            return
        await self._follow(request_id, after=after)

    # -- relaying the answer -------------------------------------------------------------------

    async def _started(self, request_id: str, written: Entry | None = None) -> None:
        """`written`: the answer's first event, when this socket published it."""
        await self._send({"type": "request", "request_id": request_id})
        await self._follow(request_id, after="0", written=written)

    async def _follow(self, request_id: str, *, after: str, written: Entry | None = None):
        if self.relay and not self.relay.done():
            self.relay.cancel()
        self.following = request_id
        self.relay = asyncio.create_task(self._relay(request_id, after, written))

    async def _relay(self, request_id: str, after: str, written: Entry | None) -> None:
        stream = keys().output(request_id)
        async for batch in get_hub().batches(stream, after=after, written=written):
            for frame in frames_for_batch(request_id, batch):
                await self._send(frame)

    async def _send(self, frame: dict) -> None:
        await self.send(text_data=orjson.dumps(frame).decode())

    async def _error(self, message: str) -> None:
        await self._send({"type": "error", "message": message})

    async def _refuse(self, message: str) -> None:
        """An error reply to a frame that made no trip to the database (which would have
        checked the session on the way): it checks the session first."""
        await db_call(self._require_session)()
        await self._error(message)

    # -- the login session ---------------------------------------------------------------------

    def _account_event(self, fields: dict | None) -> None:
        """An account event of this socket's user (None: events may have been missed): the
        session is re-checked, and the socket closes if it no longer stands."""
        if self.ended:
            return
        if tab_sync.is_chat_event(fields):
            asyncio.get_running_loop().create_task(self._chat_event(fields))
            return
        if fields is not None and fields.get("session") == self.session_digest:
            asyncio.get_running_loop().create_task(self._end_session())
            return
        if self.session_watch is None or self.session_watch.done():
            self.session_watch = asyncio.get_running_loop().create_task(self._recheck())

    async def _chat_event(self, fields: dict) -> None:
        """A change made in another tab (this tab's own question is shown already)."""
        request_id = fields.get("request_id")
        if request_id and request_id == self.following:
            return
        frames = tab_sync.frames_for_event(fields, conversation_id=self.conversation.id)
        for frame in frames:
            await self._send(frame)
        if request_id != self.following and frames and frames[-1]["type"] == "user_message":
            await self._started(request_id)

    async def _recheck(self) -> None:
        if not await self._session_current():
            await self._end_session()

    async def _session_current(self) -> bool:
        try:
            await db_call(self._require_session)()
        except SessionEnded:
            return False
        except OUTAGES as exc:
            # Unknown while the database is away; every frame checks again before acting.
            log.warning("session of user %s not checked: %s", self.user.pk, exc)
        return True

    async def _end_session(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.stop_listening is not None:
            self.stop_listening()
        for task in (self.relay, self.session_watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self.close(code=SESSION_ENDED_CODE)

    def _require_session(self) -> None:
        """Raises SessionEnded unless the socket's session still stands. In a pool thread."""
        self.session.require()

    def _in_session(self, func, /, *args, **kwargs):
        """`func` after the session check, in the same trip through the pool."""
        self._require_session()
        return func(*args, **kwargs)

    # -- database ------------------------------------------------------------------------------

    @db_call
    def _open(self, conversation_id: int) -> tuple[Conversation, str | None]:
        """The conversation (Http404 unless it is the user's) and its answer in progress, if
        any, to show at once (a refresh or a second tab continues live): one trip through the
        pool, as every tab that opens asks both. The login checked the session just before."""
        conversation = selectors.conversation_get_for_user(user=self.user, id=conversation_id)
        try:
            active = submission.active_request_id(conversation=conversation)
        except RedisError:
            active = None  # the page still works; sending will explain the outage
        return conversation, active

    @db_call
    def _submit(self, text: str, request_id: str) -> submission.Submitted:
        """Sends the question, in one trip through the pool, the session checked by the
        question's own insert."""
        question = submission.Question(
            user=self.user, conversation=self.conversation, text=text, request_id=request_id
        )
        return self.session.guarded(
            lambda condition: submission.request_submit(question, only_if=condition)
        )

    @db_call
    def _stop(self, requested) -> bool:
        """Stops the requested answer, or the conversation's answer in progress; False when
        there is none. One trip through the pool."""
        self._require_session()
        request_id = requested or submission.active_request_id(conversation=self.conversation)
        if not isinstance(request_id, str) or not request_id:
            return False
        services.request_cancel(user=self.user, request_id=request_id)
        return True


def _draft_of(text_data: str | None) -> str | None:
    """The text of a "send" frame, to hand back when it could not be sent."""
    try:
        frame = orjson.loads(text_data or "")
    except orjson.JSONDecodeError:
        return None
    if isinstance(frame, dict) and frame.get("type") == "send":
        text = frame.get("text")
        return text if isinstance(text, str) else None
    return None
