"""What background requests ask the model for suggestions, and how their answers are read:
follow-up questions after an answer, and profile tags proposed from a user's questions.

The model is small and its format loose, so parsing is forgiving (numbering, bullets, quotes)
but strict about what comes out: at most three real questions; only tag names the admin
defined.
"""

from __future__ import annotations

import re

from apps.accounts.models import Profile, Tag, TagProposal
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
