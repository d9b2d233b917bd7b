"""A new chat's title, written by the model.

A conversation is named at once from its first question (turns.title_from_question), so the
sidebar never shows "New chat"; a background request then asks the model for a short title,
and when it comes back it replaces that first name, unless the user renamed the chat in the
meantime, and every open tab of the user shows it (tab_sync.py). Background requests go through
the same admission and queue, served after people's questions (background.py).
"""

from __future__ import annotations

import re

from django.db import connection

from apps.chat import tab_sync
from apps.chat.models import Conversation

TASK = "title"
MAX_TOKENS = 16
MAX_WORDS = 8
TITLE_MAX = 60
# How long the request may wait in line while the service degrades; then it is dropped
# quietly and the chat keeps the name its first question gave it.
WAIT_SECONDS = 180

INSTRUCTION = "You write short titles for chats. Reply with the title only."
# Examples teach the small demo model the task better than any instruction (it otherwise
# answers the question).
EXAMPLES = (
    ("How can I make my sourdough bread rise more?", "Sourdough bread rising tips"),
    ("what's the difference between TCP and UDP", "TCP versus UDP"),
    ("Write a poem about autumn leaves", "Poem about autumn leaves"),
)
ASK = "Title for a chat that starts: "


def title_messages(*, question: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": INSTRUCTION}]
    for example, title in EXAMPLES:
        messages += [
            {"role": "user", "content": ASK + example},
            {"role": "assistant", "content": title},
        ]
    messages.append({"role": "user", "content": ASK + question[:600]})
    return messages


def title_purpose(*, conversation: Conversation) -> dict:
    """What the finished request needs: whose title, and the name it may replace."""
    return {
        "task": TASK,
        "conversation": conversation.id,
        "provisional": conversation.title,
        "wait_s": WAIT_SECONDS,
    }


_PREFIX = re.compile(r"^(title|chat title|here is a title|sure)\b[^:]*:\s*", re.IGNORECASE)
_DECORATION = "\"'\u201c\u201d\u2018\u2019`*#_[]()<>"  # quotes, Markdown marks


def title_from_answer(text: str) -> str:
    """The title in the model's reply, tidied; "" when there is none worth showing."""
    line = next((part for part in (text or "").splitlines() if part.strip()), "")
    line = _PREFIX.sub("", line.strip()).strip().strip(_DECORATION).strip()
    line = " ".join(line.split()).rstrip(".!:;,").strip(_DECORATION).strip()
    words = line.split(" ")
    if not line or len(words) > MAX_WORDS or len(line) > TITLE_MAX:
        return ""
    return line[0].upper() + line[1:]


def title_finished(*, purpose: dict, answer_text: str) -> bool:
    """Stores the model's title unless the chat was renamed (or deleted) since it was asked;
    True when stored (and told to the user's tabs)."""
    title = title_from_answer(answer_text)
    if not title:
        return False
    table = Conversation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET title = %s WHERE id = %s AND title = %s RETURNING owner_id",
            [title, int(purpose["conversation"]), purpose.get("provisional", "")],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    conversation = Conversation(id=int(purpose["conversation"]), owner_id=row[0], title=title)
    tab_sync.title_published(conversation=conversation)
    return True
