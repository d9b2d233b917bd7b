"""The chat page's websocket: send, stop, regenerate, and the answer streamed back live.

Frames from the browser are JSON: {"type": "send", "text": ...}, {"type": "stop"},
{"type": "regenerate"}, {"type": "resume", "request_id": ..., "last_event_id": ...}.
Frames to the browser: "request" (a request started), "user_message", "status" (queued,
position, ETA), "start" (an attempt began: drop partial text), "delta", "final" (sanitised
HTML of the whole answer), "error" (a problem with the last frame; the socket stays open).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import ValidationError
from django.http import Http404
from django.utils.html import escape, linebreaks
from redis.exceptions import RedisError

from worker.protocol import EventType

from . import generation, selectors
from .hub import get_hub
from .keys import keys
from .markdown import render_markdown
from .models import Conversation
from .offload import db_call

log = logging.getLogger("sluice.chat.ws")

MAX_FRAME_BYTES = 64 * 1024


class ChatConsumer(AsyncWebsocketConsumer):
    async def dispatch(self, message: dict) -> None:
        if message["type"] == "websocket.receive":
            # Channels first tidies the database connections of its one shared sync thread,
            # before every frame: a hop through that thread on each message sent. This
            # consumer's frames do their database work through `db_call`, which tidies the
            # pool thread's own connection, so they skip it.
            await self.websocket_receive(message)
        else:
            await super().dispatch(message)

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=4401)
            return
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        try:
            self.conversation, active = await self._open(conversation_id)
        except Http404:
            await self.close(code=4404)
            return
        self.relay: asyncio.Task | None = None
        await self.accept()
        if active:
            await self._follow(active, after="0")

    async def disconnect(self, code: int) -> None:
        relay = getattr(self, "relay", None)
        if relay:
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relay

    # -- frames from the browser ---------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        if text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self._error("That message could not be read (send JSON text under 64 KB).")
            return
        try:
            frame = json.loads(text_data)
            kind = frame["type"]
        except (ValueError, KeyError, TypeError):
            await self._error("That message could not be read (malformed JSON).")
            return
        handler = {
            "send": self._on_send,
            "stop": self._on_stop,
            "regenerate": self._on_regenerate,
            "resume": self._on_resume,
        }.get(kind)
        if handler is None:
            await self._error(f"Unknown action {str(kind)[:40]!r}.")
            return
        await handler(frame)

    async def _on_send(self, frame: dict) -> None:
        text = frame.get("text")
        if not isinstance(text, str):
            await self._error("Type a message first.")
            return
        try:
            submitted = await self._submit(text)
        except ValidationError as exc:
            await self._error(" ".join(exc.messages))
            return
        except generation.GenerationBusy as exc:
            await self._error(str(exc))
            return
        except generation.GenerationUnavailable as exc:
            await self._send({"type": "error", "message": str(exc), "draft": text})
            return
        message = submitted.user_message
        await self._send({"type": "user_message", "id": message.id,
                          "html": linebreaks(escape(message.text))})  # fmt: skip
        await self._started(submitted.request_id)

    async def _on_regenerate(self, frame: dict) -> None:
        try:
            submitted = await db_call(generation.generation_regenerate)(
                user=self.user, conversation=self.conversation
            )
        except (generation.GenerationBusy, generation.GenerationUnavailable) as exc:
            await self._error(str(exc))
            return
        await self._send({"type": "regenerating"})
        await self._started(submitted.request_id)

    async def _on_stop(self, frame: dict) -> None:
        request_id = frame.get("request_id") or await db_call(generation.active_request_id)(
            conversation=self.conversation
        )
        if not isinstance(request_id, str) or not request_id:
            await self._error("Nothing is being generated.")
            return
        try:
            await db_call(generation.generation_cancel)(user=self.user, request_id=request_id)
        except Http404:
            await self._error("That answer was not found.")

    async def _on_resume(self, frame: dict) -> None:
        request_id = frame.get("request_id")
        after = frame.get("last_event_id") or "0"
        if not isinstance(request_id, str) or not isinstance(after, str):
            await self._error("That answer was not found.")
            return
        try:
            info = await db_call(generation.request_get_for_user)(
                user=self.user, request_id=request_id
            )
        except Http404:
            await self._error("That answer was not found.")
            return
        if info.conversation_id != self.conversation.id:
            await self._error("That answer was not found.")
            return
        await self._follow(request_id, after=after)

    # -- relaying the answer -------------------------------------------------------------------

    async def _started(self, request_id: str) -> None:
        await self._send({"type": "request", "request_id": request_id})
        await self._follow(request_id, after="0")

    async def _follow(self, request_id: str, *, after: str) -> None:
        if self.relay and not self.relay.done():
            self.relay.cancel()
        self.relay = asyncio.create_task(self._relay(request_id, after))

    async def _relay(self, request_id: str, after: str) -> None:
        stream = keys().output(request_id)
        async for batch in get_hub().batches(stream, after=after):
            for frame in frames_for_batch(request_id, batch):
                await self._send(frame)

    async def _send(self, frame: dict) -> None:
        await self.send(text_data=json.dumps(frame))

    async def _error(self, message: str) -> None:
        await self._send({"type": "error", "message": message})

    # -- database ------------------------------------------------------------------------------

    @db_call
    def _open(self, conversation_id: int) -> tuple[Conversation, str | None]:
        """The conversation (Http404 unless it is the user's) and its answer in progress, if
        any, to show at once: a refresh or a second tab continues live. One trip through the
        pool, as every tab that opens asks both."""
        conversation = selectors.conversation_get_for_user(user=self.user, id=conversation_id)
        try:
            active = generation.active_request_id(conversation=conversation)
        except RedisError:
            active = None  # the page still works; sending will explain the outage
        return conversation, active

    @db_call
    def _submit(self, text: str) -> generation.Submitted:
        return generation.generation_submit(
            user=self.user, conversation=self.conversation, text=text
        )


def frames_for_batch(request_id: str, entries: list[tuple[str, dict[str, str]]]) -> list[dict]:
    """Frames for entries read together, consecutive deltas merged into one frame (carrying
    the last one's id, so a resume continues after all of them): a page that fell behind, or
    a busy web process, sends one frame where the worker wrote several."""
    frames: list[dict] = []
    for entry_id, fields in entries:
        frame = frame_for_event(request_id, entry_id, fields)
        if frame is None:
            continue
        if frame["type"] == "delta" and frames and frames[-1]["type"] == "delta":
            frames[-1]["text"] += frame["text"]
            frames[-1]["event_id"] = entry_id
        else:
            frames.append(frame)
    return frames


def frame_for_event(request_id: str, entry_id: str, fields: dict[str, str]) -> dict | None:
    """An output-stream entry as the browser sees it (shared by the websocket and SSE)."""
    kind = fields.get("type")
    base = {"request_id": request_id, "event_id": entry_id}
    if kind == EventType.DELTA:
        return {**base, "type": "delta", "text": fields.get("text", "")}
    if kind == EventType.START:
        return {**base, "type": "start", "attempt": int(fields.get("attempt", 1)),
                "worker": fields.get("worker", "")}  # fmt: skip
    if kind == EventType.STATUS:
        frame = {**base, "type": "status", "state": fields.get("state", "")}
        for name in ("position", "eta_seconds", "reason", "retry_after"):
            if name in fields:
                frame[name] = fields[name]
        if fields.get("citations"):
            frame["citations"] = json.loads(fields["citations"])
        return frame
    if kind == EventType.FINAL:
        text = fields.get("text", "")
        return {
            **base,
            "type": "final",
            "state": fields.get("state", ""),
            "text": text,
            "html": render_markdown(text),
            "error": fields.get("error", ""),
            "usage": json.loads(fields.get("usage") or "{}"),
        }
    return None
