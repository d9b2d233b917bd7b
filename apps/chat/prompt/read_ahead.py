"""A prompt's sources read ahead: in the submit's first round trip to Redis (with the
conversation's state), before the question is stored, so that building the prompt waits on no
round trip of its own, and the write that round trip would carry (the question's turn for the
hot tier) rides with the request's publication instead.

The read holds every turn but the question, which the submit stores itself and adds. It is
used only when the conversation was free when it was read: the recorder stores an answer and
pushes its turn before it releases the conversation, so the read holds every answer. Otherwise
(the submit waited for the recorder, the tier was cold, a Redis error, a regenerated answer)
the prompt is read after the insert, as without the read ahead.

Measured on and off (`bench/ab.py c6360da submit --pairs 3`, run from a tree where the submit
reads the prompt and the user's corpora in round trips of their own, corpora_cache.Read being
the same plumbing): with the hot tier on, 1.31 -> 1.53 ms of the web's CPU per message (+17 %)
and 2.33 -> 2.66 ms of wall time (+14 %) without it. Kept for that.
"""

from __future__ import annotations

from django.conf import settings

from apps.chat.models import Conversation
from apps.chat.prompt import hot
from apps.chat.selectors import PromptSources, Turn


class PromptRead:
    """Queued on the submit's first pipeline (`queue`), given its replies (`received`)."""

    COMMANDS = 3  # hot.sources_queue's

    def __init__(self, conversation: Conversation, limit: int) -> None:
        self.conversation = conversation
        self.limit = limit
        self.queued = False
        self.replies: list | None = None

    def queue(self, pipe) -> None:
        if hot.enabled() and self.limit <= settings.HOT_TIER_TURNS:
            hot.sources_queue(pipe, self.conversation, self.limit)
            self.queued = True

    def received(self, replies: list) -> None:
        """The replies from `queue`'s commands on; an error among them leaves it unread."""
        own = replies[: self.COMMANDS] if self.queued else []
        failed = len(own) < self.COMMANDS or any(isinstance(r, Exception) for r in own)
        self.replies = None if failed else own

    def sources(self, *, question: Turn | None) -> PromptSources | None:
        """The prompt's sources with the question stored since the read, or None when the read
        failed or there is no question."""
        if self.replies is None or question is None:
            return None
        return hot.sources_from(self.replies, self.limit, [question])


class WritesAhead:
    """What the prompt's read would have carried (the question's turn), for the request's
    publication to queue before its own commands."""

    def __init__(self, conversation_id: int, question: Turn):
        self.turns = {conversation_id: [question]}

    def queue(self, pipe) -> None:
        hot.turns_push(pipe, self.turns)

    def unwritten(self) -> None:
        """The pipeline failed, or one of these writes did: the conversation's entries go
        (a reader refills them from PostgreSQL)."""
        hot.turns_unwritten(self.turns)

    def received(self, replies: list) -> None:
        if any(isinstance(reply, Exception) for reply in replies):
            self.unwritten()


def sources_for(
    read: PromptRead | None, *, question: Turn | None
) -> tuple[PromptSources | None, WritesAhead | None]:
    """The sources read ahead and the write they leave to the publication; (None, None)
    when the prompt is to be read as usual."""
    sources = read.sources(question=question) if read is not None else None
    if sources is None:
        return None, None
    return sources, WritesAhead(read.conversation.pk, question)
