"""Conversation memory: what of a long conversation goes into the prompt, and its summary.

A prompt is the system prompt (with the user's profile), then what the conversation remembers
of turns that no longer fit: the rolling summary, the turns the user pinned and what the user
stated in older turns (statements, not questions: a name, a number, a preference; those that
look most like facts about the user first), then the most recent turns that fit. When recent
turns start falling out, the oldest of them are folded into the summary by a background
request: the previous summary plus only the newly dropped turns, so each turn is summarised
once, never the whole history again.

The summary comes from the model, and a small model drops details; the user's statements are
kept verbatim, so a fact the user stated survives even when the summary lost it
(bench/memory.py measures which of the two carries the facts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.db import transaction
from django.shortcuts import get_object_or_404

from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.selectors import PromptSources, Turn

# Shares of the turns' token budget that remembered context may take, so recent turns always
# keep most of it.
SUMMARY_SHARE = 0.25
KEY_SHARE = 0.25
# A summary folds in old turns until the raw recent turns take at most this share of their
# budget: room for several more exchanges before the next summary is due.
KEEP_RAW_SHARE = 0.5
# The most of the conversation one summary request reads (the summariser's own window is the
# model's context too); a longer backlog is folded in over several requests.
SUMMARY_INPUT_TOKENS = 900
# Room for a few dozen short lines of notes; an answer that still runs into the cap is kept up
# to its last complete line or sentence (summary_text), never cut mid-word.
SUMMARY_MAX_TOKENS = 240

# The summariser reads what the user said, not the answers: a small model given a transcript
# continues it instead of summarising it, and the answers say little about the user.
SUMMARY_SYSTEM = "You write short notes about a user."
SUMMARY_INSTRUCTIONS = (
    "Rewrite the notes: one short line per fact the user stated about themselves (name, "
    "numbers, places, preferences), copied exactly, then one line listing the topics they "
    "asked about."
)


def estimate_tokens(text: str) -> int:
    """About four characters a token for English text, plus a few for the chat template."""
    return len(text) // 4 + 4


# -- key facts --------------------------------------------------------------------------------

# What the user asserts (not what they ask or request) is what they told the assistant: every
# statement of theirs is a candidate, and those that look like facts about them come first.
_REQUEST = re.compile(
    r"^(please\s+)?(tell|explain|show|give|write|list|help|describe|summari[sz]e|compare|"
    r"translate|make|find|can|could|would|will|what|why|how|when|where|who|which|is|are|do|"
    r"does|thanks|thank|ok|okay|yes|no)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(r"\b(my|mine|me|i|i'm|i'd|i've|we|our|us)\b", re.IGNORECASE)
_STRONG = re.compile(
    r"\b(my name|call me|remember|prefer|rather|favou?rite|allergic|birthday|born|live|"
    r"moved|work|number|code|reference|budget|deadline)\b",
    re.IGNORECASE,
)
_NAME_LIKE = re.compile(r"(?<=\s)[A-Z][a-z]+")  # a capitalised word inside a sentence
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def fact_sentences(text: str) -> list[str]:
    """The statements of a user's turn: not questions, not requests, not one or two words."""
    found = []
    for match in _SENTENCE.finditer(text):
        sentence = match.group().strip()
        if sentence.endswith("?") or len(sentence.split()) < 3 or _REQUEST.match(sentence):
            continue
        found.append(sentence)
    return found


def fact_score(sentence: str) -> int:
    """How much a statement looks like a fact about the user: first person, the words facts
    come with, names and numbers."""
    number = 2 if re.search(r"\d", sentence) else 0
    return (
        2 * len(_STRONG.findall(sentence))
        + len(_FIRST_PERSON.findall(sentence))
        + len(_NAME_LIKE.findall(sentence))
        + number
    )


# -- the prompt -------------------------------------------------------------------------------


@dataclass
class Plan:
    """What goes into one prompt, and what is due to be folded into the summary."""

    system: str  # the system prompt with the remembered context appended
    turns: list[dict[str, str]]  # the recent turns, oldest first
    to_summarise: list[Turn] = field(default_factory=list)  # oldest first; [] when none due
    kept_facts: list[str] = field(default_factory=list)


def _fill(turns: list[Turn], budget: int) -> list[Turn]:
    """The newest of `turns` (newest first) whose costs fit `budget`, newest first."""
    kept = []
    for turn in turns:
        cost = estimate_tokens(turn.text)
        if cost > budget:
            break
        budget -= cost
        kept.append(turn)
    return kept


def _clip(text: str, tokens: int) -> str:
    chars = max(0, tokens - 4) * 4
    return text if len(text) <= chars else text[: max(0, chars - 1)] + "…"


def _remembered_block(pinned: list[Turn], dropped: list[Turn], budget: int) -> tuple[str, list]:
    """Pinned turns first (newest first), then fact sentences of dropped questions, the
    strongest first, within `budget` tokens; listed oldest first."""
    lines: list[tuple[int, str]] = []
    used = estimate_tokens("Earlier in this conversation:")
    for turn in pinned:
        speaker = "User" if turn.role == Message.Role.USER else "Assistant"
        line = f"- {speaker} (pinned): {_clip(turn.text, 120)}"
        if used + estimate_tokens(line) > budget:
            break
        used += estimate_tokens(line)
        lines.append((turn.id, line))
    pinned_ids = {turn.id for turn in pinned}
    facts = [
        (fact_score(s), turn.id, s)
        for turn in dropped
        if turn.role == Message.Role.USER and turn.id not in pinned_ids
        for s in fact_sentences(turn.text)
    ]
    facts.sort(key=lambda fact: (-fact[0], -fact[1]))
    kept_facts = []
    for _, turn_id, sentence in facts:
        line = f"- User said: {_clip(sentence, 60)}"
        if used + estimate_tokens(line) > budget:
            continue  # a shorter one may still fit
        used += estimate_tokens(line)
        lines.append((turn_id, line))
        kept_facts.append(sentence)
    if not lines:
        return "", []
    lines.sort()
    return "Earlier in this conversation:\n" + "\n".join(line for _, line in lines), kept_facts


def plan_prompt(*, system: str, sources: PromptSources, budget: int) -> Plan:
    """Fits the conversation into `budget` tokens (what the window leaves after the system
    prompt and the answer): summary, pinned and key-fact turns, then the latest turns."""
    history = sources.history
    if not history:
        return Plan(system=system, turns=[])
    uncovered = after_summary(history, sources.summary_upto)
    pinned = sources.pinned
    total = sum(estimate_tokens(t.text) for t in uncovered)
    read = {t.id for t in history}
    if not sources.summary and total <= budget and all(t.id in read for t in pinned):
        # Everything fits: the whole conversation, as it was said.
        return Plan(system=system, turns=_as_messages(reversed(history)))

    question = history[0]
    if estimate_tokens(question.text) > budget:  # the latest question alone is too long
        clipped = {"role": question.role, "content": question.text[-max(0, budget - 4) * 4 :]}
        return Plan(system=system, turns=[clipped])

    summary = ""
    if sources.summary:
        summary = "What you remember of this conversation so far:\n" + _clip(
            sources.summary, int(budget * SUMMARY_SHARE)
        )
    remaining = budget - (estimate_tokens(summary) if summary else 0)
    key_cap = int(budget * KEY_SHARE)
    recent = _fill(uncovered, remaining - key_cap) or [question]
    recent_ids = {t.id for t in recent}
    dropped = [t for t in history if t.id not in recent_ids]
    remembered, kept_facts = _remembered_block(
        [t for t in pinned if t.id not in recent_ids], dropped, key_cap
    )
    remaining -= estimate_tokens(remembered) if remembered else 0
    # What the remembered block left unused goes back to recent turns.
    recent = _fill(uncovered, remaining) or recent
    blocks = [b for b in (system, summary, remembered) if b]
    plan = Plan(
        system="\n\n".join(blocks), turns=_as_messages(reversed(recent)), kept_facts=kept_facts
    )
    if len(recent) < len(uncovered):
        plan.to_summarise = due_for_summary(uncovered, budget=int(remaining * KEEP_RAW_SHARE))
    return plan


def after_summary(history: list[Turn], upto: int) -> list[Turn]:
    """The turns of `history` (newest first) the summary does not cover: those after its last
    turn in the conversation's own order (created, then id, as `history` is read), not those
    with a higher id: an answer stored in one statement with the next question may have the
    higher id of the two while it comes first. A last turn not among them is older than all."""
    if upto:
        for index, turn in enumerate(history):
            if turn.id == upto:
                return history[:index]
    return list(history)


def due_for_summary(uncovered: list[Turn], *, budget: int) -> list[Turn]:
    """The oldest of the not yet summarised turns (newest first in `uncovered`): all but the
    newest that fit `budget`, at most SUMMARY_INPUT_TOKENS of them, oldest first."""
    keep = len(_fill(uncovered, budget))
    due, used = [], 0
    for turn in reversed(uncovered[max(keep, 1) :]):
        used += estimate_tokens(turn.text) if turn.role == Message.Role.USER else 0
        if due and used > SUMMARY_INPUT_TOKENS:
            break
        due.append(turn)
    return due


def _as_messages(turns) -> list[dict[str, str]]:
    return [{"role": t.role, "content": t.text} for t in turns]


# -- the summary ------------------------------------------------------------------------------


def summary_messages(*, previous: str, turns: list[Turn]) -> list[dict[str, str]]:
    """The background request that folds `turns` into the previous summary: the notes so far,
    then the user's own words from the turns, then the instruction (last, where a small model
    heeds it)."""
    said = [f"- {_clip(t.text, 150)}" for t in turns if t.role == Message.Role.USER]
    notes = previous.strip() or "(none)"
    return [
        {"role": "system", "content": SUMMARY_SYSTEM},
        {
            "role": "user",
            "content": f"Notes so far:\n{notes}\n\nThe user said:\n"
            + "\n".join(said)
            + f"\n\n{SUMMARY_INSTRUCTIONS}",
        },
    ]


# Where a note or a sentence ends: a line break, or an end mark before a space or the end.
_COMPLETE = re.compile(r"\n|[.!?\u2026][\"')\]\u201d\u2019]*(?=\s|$)")


def summary_text(*, previous: str, answer: str, finish_reason: str = "") -> str:
    """The stored summary: the model's notes; the previous ones kept when it wrote nothing.
    Notes the answer cap cut (`finish_reason` "length") end at their last complete line or
    sentence: half a fact stored as memory would be repeated as if it were whole."""
    text = answer.strip()
    if finish_reason == "length":
        ends = [match.end() for match in _COMPLETE.finditer(text)]
        text = text[: ends[-1]].strip() if ends else ""
    return text or previous


@transaction.atomic
def summary_store(
    *,
    conversation_id: int,
    upto_message_id: int,
    text: str,
    model: str = "",
    covered_from: int = 0,
) -> ConversationSummary | None:
    """Stores the summary if it moves the conversation's memory forward: a late or repeated
    answer for turns already summarised, or one written from an older summary than the one
    stored now (`covered_from`: the upto it started from), changes nothing."""
    if not Conversation.objects.filter(id=conversation_id).exists():
        return None
    current = (
        ConversationSummary.objects.select_for_update()
        .filter(conversation_id=conversation_id)
        .first()
    )
    if current is not None and (
        current.upto_message_id != covered_from
        or not _comes_after(conversation_id, upto_message_id, current.upto_message_id)
    ):
        return None
    if current is None:
        return ConversationSummary.objects.create(
            conversation_id=conversation_id, text=text, upto_message_id=upto_message_id, model=model
        )
    current.text, current.upto_message_id, current.model = text, upto_message_id, model
    current.save()
    return current


def _comes_after(conversation_id: int, later: int, earlier: int) -> bool:
    """Whether message `later` comes after `earlier` in the conversation's order (created,
    then id); a gone `earlier` is passed, a gone `later` is not."""
    created = dict(
        Message.objects.filter(
            conversation_id=conversation_id, id__in=(later, earlier)
        ).values_list("id", "created")
    )
    if later not in created:
        return False
    return earlier not in created or (created[later], later) > (created[earlier], earlier)


def summary_for(*, conversation: Conversation) -> ConversationSummary | None:
    return ConversationSummary.objects.filter(conversation=conversation).first()


def message_set_pinned(*, conversation: Conversation, message_id: int, pinned: bool) -> Message:
    """Pins or unpins one of the conversation's messages; Http404 for any other id."""
    message = get_object_or_404(Message, conversation=conversation, id=message_id)
    message.pinned = pinned
    message.save(update_fields=["pinned"])
    return message
