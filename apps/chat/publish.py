"""Publishing a request: its state, the conversation's active request, its first event and
its admission entry, in one round trip to Redis. The one place a request of any kind enters
Redis (a person's question through submission.request_submit, the OpenAI API, Sluice's
background work): the caller built the work item and set its kind."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings

from apps.streams.hub_base import Entry
from contract import protocol, transitions
from contract.protocol import Keys, WorkItem
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.chat.submission")


def request_publish(
    *,
    item: WorkItem,
    citations: list | None = None,
    notice: str = "",
    also: Callable[[Any], None] | None = None,
    api_key: str = "",
) -> Entry:
    """Hands the request to admission; returns the first event of its output stream (id and
    fields), for the caller's reader to start after. Past the Redis client's timeout the
    caller reports a failure; Redis may still run the commands later (it was frozen), so the
    entry says by when it counts and the dispatcher withdraws it after that. `also` queues
    more commands on the same pipeline (the tabs' event): their failure is not the request's,
    so it is not raised. `api_key`: the SHA-256 of the API key the request came with.
    `notice`: what the person is told beside the answer (retrieval unavailable), in its first
    event."""
    k = keys()
    submit_by_ms = protocol.now_ms() + int(settings.REDIS_SOCKET_TIMEOUT * 1000)
    pipe = get_redis().pipeline(transaction=False)
    event = transitions.submitted(
        pipe,
        k,
        item,
        citations=citations or [],
        notice=notice,
        stream=submit_stream(k, model=item.model),
        submit_by_ms=submit_by_ms,
        api_key=api_key,
    )
    own = len(pipe)
    if also is not None:
        also(pipe)
    replies = pipe.execute(raise_on_error=False)
    failed = [reply for reply in replies[:own] if isinstance(reply, Exception)]
    if failed:
        raise failed[0]
    for reply in replies[own:]:
        if isinstance(reply, Exception):
            log.warning(
                "request %s: the event for the user's other tabs failed: %s", item.id, reply
            )
    log.info(
        "request %s submitted: %s by user %s in conversation %s, about %d prompt tokens",
        item.id,
        item.kind,
        item.user_id,
        item.conversation_id,
        item.prompt_tokens_estimate,
    )
    return replies[event.reply_index], event.fields


def submit_stream(k: Keys, *, model: str = "") -> str:
    """Where new requests go: the model's work stream directly (admission control comes in
    front of it when SLUICE_ADMISSION is on)."""
    return k.admit if settings.SLUICE_ADMISSION else k.work_for_model(model)
