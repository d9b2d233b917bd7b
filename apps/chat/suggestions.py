"""What background requests ask the model for suggestions, and how their answers are read:
follow-up questions after an answer, profile tags proposed from a user's questions, and a new
chat's title.

The model is small and its format loose, so parsing is forgiving (numbering, bullets, quotes)
but strict about what comes out: at most three real questions; only tag names the admin
defined.
"""

from __future__ import annotations

import re

from django.db import connection

from apps.accounts.models import Profile, Tag, TagProposal
from apps.chat import tab_sync
from apps.chat.models import Conversation, Message

FOLLOWUPS_MAX = 3
FOLLOWUP_MAX_CHARS = 160
FOLLOWUPS_MAX_TOKENS = 96
TAGS_MAX_TOKENS = 48
QUESTIONS_FOR_TAGS = 20  # the user's latest questions a tag proposal reads

# Small models follow an example far better than an instruction: each request shows one
# worked exchange in the wanted format, then asks for the real one.
FOLLOWUPS_EXAMPLE = [
    {"role": "system", "content": "You suggest follow-up questions."},
    {"role": "user", "content": "Topic: How do tides work?\nSuggest three follow-up questions."},
    {
        "role": "assistant",
        "content": "1. Why are there two high tides a day?\n2. How does the "
        "moon pull on the sea?\n3. What is a spring tide?",
    },
]
TAGS_EXAMPLE = [
    {"role": "system", "content": "You match a user to profile tags."},
    {
        "role": "user",
        "content": "Tags: Cook, Runner, Parent\nQuestions:\n- How long do I boil "
        "an egg?\n- What goes well in a pasta sauce?\nWhich tags fit?",
    },
    {"role": "assistant", "content": "Cook"},
]

_LEADER = re.compile(r"^\s*(?:[-*•]|\d+[.)]|q\d*[:.)])?\s*", re.IGNORECASE)
_EXAMPLE_QUESTIONS = {
    _LEADER.sub("", line).lower() for line in FOLLOWUPS_EXAMPLE[2]["content"].splitlines()
}


def followups_messages(*, question: str) -> list[dict[str, str]]:
    topic = " ".join(question.split())[:300]
    return [
        *FOLLOWUPS_EXAMPLE,
        {"role": "user", "content": f"Topic: {topic}\nSuggest three follow-up questions."},
    ]


def followups_parse(text: str, *, question: str = "") -> list[str]:
    """Up to three distinct questions from the model's answer, stripped of numbering."""
    found: list[str] = []
    # Never the question itself, nor the example's questions copied back.
    seen = {question.strip().lower(), *_EXAMPLE_QUESTIONS}
    for line in text.splitlines():
        for part in re.findall(r"[^?]*\?", _LEADER.sub("", line)):
            candidate = part.strip().strip("\"'“”").strip()
            candidate = _LEADER.sub("", candidate)
            if len(candidate.split()) < 3 or len(candidate) > FOLLOWUP_MAX_CHARS:
                continue
            if candidate.lower() in seen:
                continue
            seen.add(candidate.lower())
            found.append(candidate)
            if len(found) == FOLLOWUPS_MAX:
                return found
    return found


def followups_question_for(*, conversation_id: int) -> str:
    """The question the latest answer answered (what the follow-ups follow)."""
    last = (
        Message.objects.filter(conversation_id=conversation_id, role=Message.Role.USER)
        .order_by("-created", "-id")
        .values_list("text", flat=True)
        .first()
    )
    return last or ""


def tags_open_for(*, user_id: int) -> list[Tag]:
    """Active tags the user neither has nor was ever proposed (a rejected tag stays rejected)."""
    return list(
        Tag.objects.filter(is_active=True)
        .exclude(profiles__user_id=user_id)
        .exclude(proposals__user_id=user_id)
    )


def tags_messages(*, user_id: int, tags: list[Tag]) -> list[dict[str, str]] | None:
    """The request that asks which tags fit; None when the user has asked nothing yet."""
    questions = list(
        Message.objects.filter(
            conversation__owner_id=user_id,
            role=Message.Role.USER,
        )
        .order_by("-created")
        .values_list("text", flat=True)[:QUESTIONS_FOR_TAGS]
    )
    if not questions or not tags:
        return None
    names = ", ".join(t.name for t in tags)
    asked = "\n".join(f"- {' '.join(q.split())[:200]}" for q in reversed(questions))
    return [
        *TAGS_EXAMPLE,
        {"role": "user", "content": f"Tags: {names}\nQuestions:\n{asked}\nWhich tags fit?"},
    ]


def tags_parse(text: str, *, tags: list[Tag]) -> list[Tag]:
    """The listed tags the answer names (by name or slug, as whole words). An answer naming
    every one of several tags repeated the list rather than chose: it proposes none."""
    lowered = "\n".join(
        line
        for line in text.lower().splitlines()
        if not line.strip().startswith(("tags:", "questions:"))
    )
    named = []
    for tag in tags:
        for label in {tag.name.lower(), tag.slug.lower()}:
            if label and re.search(rf"(?<!\w){re.escape(label)}(?!\w)", lowered):
                named.append(tag)
                break
    if len(tags) > 1 and len(named) == len(tags):
        return []
    return named


def tags_propose(*, user_id: int, tag_ids: list[int]) -> list[TagProposal]:
    """Proposals for tags the user does not have yet; one per tag, ever."""
    have = set(Profile.objects.filter(user_id=user_id).values_list("tags", flat=True))
    created = []
    for tag in Tag.objects.filter(id__in=tag_ids, is_active=True).exclude(id__in=have):
        proposal, new = TagProposal.objects.get_or_create(user_id=user_id, tag=tag)
        if new:
            created.append(proposal)
    return created


def questions_asked(*, user_id: int) -> int:
    return Message.objects.filter(conversation__owner_id=user_id, role=Message.Role.USER).count()


def conversation_exists(conversation_id: int) -> bool:
    return Conversation.objects.filter(id=conversation_id).exists()


def answer_message_id(*, request_id: str) -> int | None:
    """The stored answer a follow-up belongs to, so a page opened later finds it."""
    if not request_id:
        return None
    return Message.objects.filter(request_id=request_id).values_list("id", flat=True).first()


# -- a new chat's title ------------------------------------------------------------------------
#
# A conversation is named at once from its first question (turns.title_from_question), so the
# sidebar never shows "New chat"; a background request then asks the model for a short title,
# and when it comes back it replaces that first name, unless the user renamed the chat in the
# meantime, and every open tab of the user shows it (tab_sync.py).

TITLE_TASK = "title"
TITLE_MAX_TOKENS = 16
TITLE_MAX_WORDS = 8
TITLE_MAX = 60
# How long the request may wait in line while the service degrades; then it is dropped
# quietly and the chat keeps the name its first question gave it.
TITLE_WAIT_SECONDS = 180

TITLE_INSTRUCTION = "You write short titles for chats. Reply with the title only."
# Examples teach the small demo model the task better than any instruction (it otherwise
# answers the question).
TITLE_EXAMPLES = (
    ("How can I make my sourdough bread rise more?", "Sourdough bread rising tips"),
    ("what's the difference between TCP and UDP", "TCP versus UDP"),
    ("Write a poem about autumn leaves", "Poem about autumn leaves"),
)
TITLE_ASK = "Title for a chat that starts: "


def title_messages(*, question: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": TITLE_INSTRUCTION}]
    for example, title in TITLE_EXAMPLES:
        messages += [
            {"role": "user", "content": TITLE_ASK + example},
            {"role": "assistant", "content": title},
        ]
    messages.append({"role": "user", "content": TITLE_ASK + question[:600]})
    return messages


def title_purpose(*, conversation: Conversation) -> dict:
    """What the finished request needs: whose title, and the name it may replace."""
    return {
        "task": TITLE_TASK,
        "conversation": conversation.id,
        "provisional": conversation.title,
        "wait_s": TITLE_WAIT_SECONDS,
    }


_TITLE_PREFIX = re.compile(r"^(title|chat title|here is a title|sure)\b[^:]*:\s*", re.IGNORECASE)
_TITLE_DECORATION = "\"'\u201c\u201d\u2018\u2019`*#_[]()<>"  # quotes, Markdown marks


def title_from_answer(text: str) -> str:
    """The title in the model's reply, tidied; "" when there is none worth showing."""
    line = next((part for part in (text or "").splitlines() if part.strip()), "")
    line = _TITLE_PREFIX.sub("", line.strip()).strip().strip(_TITLE_DECORATION).strip()
    line = " ".join(line.split()).rstrip(".!:;,").strip(_TITLE_DECORATION).strip()
    words = line.split(" ")
    if not line or len(words) > TITLE_MAX_WORDS or len(line) > TITLE_MAX:
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
