"""Every open tab of a user kept in step: chat events on the user's account-events stream.

A question sent (in a new or an existing conversation, or an edit), a title changed and a
conversation deleted are published as events of type "chat" naming the user. Each web process
already follows that stream for the sessions' sake (account_watch.py) and hands a user's events
to each of that user's sockets; a socket turns a chat event into frames for its page
(`frames_for_event`): the sidebar and titles change, and a tab showing the conversation shows
the new question and follows its answer.
"""

from __future__ import annotations

import logging

from django.utils.html import escape, linebreaks
from redis.exceptions import RedisError

from apps.chat.models import Conversation, Message
from core.account_events import account_event_add
from core.redis_client import get_redis

log = logging.getLogger("sluice.chat.live")

EVENT_TYPE = "chat"


class Action:
    QUESTION = "question"  # a question was sent; "replaces": the first message an edit removed
    TITLE = "title"
    DELETED = "deleted"


def _publish(user_id: int, action: str, conversation_id: int, **fields) -> None:
    """Never raises: the other tabs miss the change (a reload shows it) while Redis is away,
    and what the user did still stands."""
    try:
        _event(get_redis(), user_id, action, conversation_id, **fields)
    except RedisError as exc:
        log.warning("chat event %s for user %s not published: %s", action, user_id, exc)


def _event(client, user_id: int, action: str, conversation_id: int, **fields) -> None:
    """Adds the event on `client`: a Redis client, or a pipeline that sends it later."""
    event = {
        "user": str(user_id),
        "type": EVENT_TYPE,
        "action": action,
        "conversation": str(conversation_id),
    }
    event.update({name: str(value) for name, value in fields.items() if value is not None})
    account_event_add(client, event)


def question_event(
    pipe,
    *,
    conversation: Conversation,
    message: Message | None,
    request_id: str,
    replaces: int | None = None,
    new: bool = False,
) -> None:
    """A question sent (or, `message` None, a new answer asked for), queued on the pipeline that
    publishes its request (submission.request_submit): every way in tells the user's tabs."""
    _event(
        pipe,
        conversation.owner_id,
        Action.QUESTION,
        conversation.id,
        **_question_fields(conversation, message, request_id, replaces=replaces, new=new),
    )


def _question_fields(
    conversation: Conversation,
    message: Message | None,
    request_id: str,
    *,
    replaces: int | None = None,
    new: bool = False,
) -> dict:
    return {
        "title": conversation.title,
        "request_id": request_id,
        "message": message.id if message else None,
        "text": message.text if message else None,
        "replaces": replaces,
        "new": "1" if new else None,
    }


def title_published(*, conversation: Conversation) -> None:
    _publish(conversation.owner_id, Action.TITLE, conversation.id, title=conversation.title)


def deletion_published(*, owner_id: int, conversation_id: int) -> None:
    _publish(owner_id, Action.DELETED, conversation_id)


def is_chat_event(fields: dict | None) -> bool:
    return fields is not None and fields.get("type") == EVENT_TYPE


def frames_for_event(fields: dict, *, conversation_id: int) -> list[dict]:
    """The frames a page showing `conversation_id` gets for a chat event. The answer itself is
    not among them: the socket follows `request_id` and relays it as usual."""
    action = fields.get("action", "")
    try:
        about = int(fields.get("conversation", ""))
    except ValueError:
        return []
    frames = [
        {
            "type": "conversation",
            "action": action,
            "id": about,
            "title": fields.get("title", ""),
            "new": fields.get("new") == "1",
            "current": about == conversation_id,
        }
    ]
    if action == Action.QUESTION and about == conversation_id:
        if fields.get("replaces"):
            frames.append({"type": "truncate", "from_message_id": int(fields["replaces"])})
        if fields.get("message"):
            frames.append(
                {
                    "type": "user_message",
                    "id": int(fields["message"]),
                    "html": linebreaks(escape(fields.get("text", ""))),
                }
            )
    return frames
