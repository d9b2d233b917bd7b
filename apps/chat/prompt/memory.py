"""Conversation memory: what of a long conversation goes into the prompt, and its summary.

A prompt is the system prompt (with the user's profile), then the memory block, then the most
recent turns that fit. The memory block holds, within MEMORY_SHARE of the turns' budget:

- the turns the user pinned;
- what the user said of themselves and their life, in their own words (memory_facts.py), oldest
  first, from the turns the prompt does not send whole (those it sends are not repeated); a
  statement that a later one may replace is shown as earlier, never as current; a reply that
  took the assistant's suggestion is shown with it; the user may correct or delete any of them
  on the page. When the block is full, the least telling leave first;
- the rolling summary's sentences (the topics the user asked about), each grounded in the
  turns it summarises, and none that names an out-of-date value or a detail the user did not
  give as their own.

When recent turns start falling out, the oldest of them are folded into the summary by a
background request: the previous summary plus only the newly dropped turns, so each turn is
summarised once. The summary's row also keeps the statements as of its last turn, so they
outlive the turns a prompt reads. bench/memory.py measures what reaches the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.shortcuts import get_object_or_404

from apps.chat import selectors
from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.prompt import memory_facts as facts
from apps.chat.prompt.memory_facts import Entry
from apps.chat.prompt.memory_summary import SUMMARY_INPUT_TOKENS
from apps.chat.prompt.memory_summary import clip as _clip
from apps.chat.prompt.memory_summary_lines import summary_lines
from apps.chat.selectors import PromptSources, Turn

# The share of the turns' token budget the memory block may take, so recent turns always keep
# half of it (at 0.4 the block's budget was what lost most facts: docs/benchmarks.md).
MEMORY_SHARE = 0.5
# A summary folds in old turns until the raw recent turns take at most this share of their
# budget: room for several more exchanges before the next summary is due.
KEEP_RAW_SHARE = 0.5


def estimate_tokens(text: str) -> int:
    """About four characters a token for English text, plus a few for the chat template."""
    return len(text) // 4 + 4


# -- the memory block ------------------------------------------------------------------------


@dataclass
class Remembered:
    """The memory block of a prompt, part by part: what the page's note shows."""

    summary: list[str] = field(default_factory=list)  # summary sentences, in order
    facts: list[Entry] = field(default_factory=list)  # the user's statements, oldest first
    others: list[Entry] = field(default_factory=list)  # an older release's entries on others
    pinned: list[Turn] = field(default_factory=list)  # newest first
    left_out: int = 0  # summary sentences and entries the budget left out
    text: str = ""  # the block as the prompt holds it

    def __bool__(self) -> bool:
        return bool(self.text)


@dataclass
class Plan:
    """What goes into one prompt, and what is due to be folded into the summary."""

    system: str  # the system prompt with the remembered context appended
    turns: list[dict[str, str]]  # the recent turns, oldest first
    to_summarise: list[Turn] = field(default_factory=list)  # oldest first; [] when none due
    remembered: Remembered = field(default_factory=Remembered)


def entries_for(sources: PromptSources) -> list[Entry]:
    """The conversation's entries, oldest first: those the summary's snapshot holds (and the
    user's edits), updated by the user turns after the summary, in the conversation's order."""
    history = sources.history
    position = {turn.id: index for index, turn in enumerate(reversed(history))}

    def newer(turn_id: int, than: int) -> bool:  # a message not read is older than all read
        return position.get(turn_id, -1) > position.get(than, -1)

    # The question being asked is the prompt's last turn: it is no memory yet.
    uncovered = after_summary(history, sources.summary_upto)
    before = history[len(uncovered) : len(uncovered) + facts.CONTEXT_TURNS]
    return facts.merge(
        facts.entries_from_json(sources.facts),
        reversed(uncovered[1:]),
        newer=newer,
        before=before[::-1],
    )


def remembered(
    *,
    sources: PromptSources,
    entries: list[Entry],
    budget: int,
    pinned: list[Turn],
    said: list[Entry] | None = None,
) -> Remembered:
    """The memory block within `budget` tokens. Filled in this order, so what leaves first
    when it is full is the last of it: pinned turns, the user's statements (the most telling
    first, memory_facts.weight_of), then the summary's sentences (in order). `said`: every
    statement of the conversation (default `entries`), those of the turns sent whole too,
    which is what the summary's sentences are checked against."""
    block = Remembered()
    used = 0

    def fits(line: str) -> bool:
        nonlocal used
        cost = estimate_tokens(line)
        if used + cost > budget:
            block.left_out += 1
            return False
        used += cost
        return True

    for turn in pinned:
        speaker = "User" if turn.role == Message.Role.USER else "Assistant"
        if fits(f"- {speaker} (pinned): {_clip(turn.text, 120)}"):
            block.pinned.append(turn)
    current = [e for e in entries if e.value]
    # The most telling first while room lasts; shown in the order they were said.
    chosen = {e.key for e in sorted(current, key=facts.weight_of, reverse=True) if fits(e.text())}
    block.facts = [e for e in current if e.key in chosen and e.kind != facts.OTHER]
    block.others = [e for e in current if e.key in chosen and e.kind == facts.OTHER]
    if sources.summary:
        checked = entries if said is None else said
        block.summary = [s for s in summary_lines(sources.summary, checked) if fits(s)]
    parts = []
    if block.summary:
        parts.append("What you remember of this conversation so far:\n" + "\n".join(block.summary))
    if block.facts:
        lines = "\n".join(f"- {e.text()}" for e in block.facts)
        parts.append(
            "What the user said earlier in this conversation, in their own words (oldest "
            f"first; a line marked {facts.EARLIER_MARK.strip(': ')} may be out of date):\n{lines}"
        )
    if block.others:
        lines = "\n".join(f"- {e.text()}" for e in block.others)
        parts.append(f"What the user said about other people (not about the user):\n{lines}")
    if block.pinned:
        lines = "\n".join(
            f"- {'User' if t.role == Message.Role.USER else 'Assistant'} (pinned): "
            f"{_clip(t.text, 120)}"
            for t in reversed(block.pinned)
        )
        parts.append(f"Earlier in this conversation:\n{lines}")
    block.text = "\n\n".join(parts)
    return block


# -- the prompt -------------------------------------------------------------------------------


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


def plan_prompt(*, system: str, sources: PromptSources, budget: int) -> Plan:
    """Fits the conversation into `budget` tokens (what the window leaves after the system
    prompt and the answer): the memory block (at most MEMORY_SHARE of it), then the latest
    turns. A conversation that fits is sent whole, with the entries the user edited."""
    history = sources.history
    if not history:
        return Plan(system=system, turns=[])
    uncovered = after_summary(history, sources.summary_upto)
    pinned = sources.pinned
    total = sum(estimate_tokens(t.text) for t in uncovered)
    read = {t.id for t in history}
    # A summary row that covers turns (its text may be empty: none of the model's notes was
    # kept) means the turns before it are read through the memory block, never sent whole.
    covered = sources.summary or sources.summary_upto
    if not covered and total <= budget and all(t.id in read for t in pinned):
        # Everything fits: the whole conversation, as it was said, and what the user corrected
        # of it on the page (the turns still say the old value).
        block = Remembered()
        if any(d.get("edited") for d in sources.facts if isinstance(d, dict)):
            entries = [e for e in entries_for(sources) if e.edited]
            block = remembered(sources=sources, entries=entries, budget=budget - total, pinned=[])
        blocks = [b for b in (system, block.text) if b]
        turns = _as_messages(reversed(history))
        return Plan(system="\n\n".join(blocks), turns=turns, remembered=block)

    question = history[0]
    if estimate_tokens(question.text) > budget:  # the latest question alone is too long
        clipped = {"role": question.role, "content": question.text[-max(0, budget - 4) * 4 :]}
        return Plan(system=system, turns=[clipped])

    turns_room = budget - int(budget * MEMORY_SHARE)
    sent = {t.id for t in _fill(uncovered, turns_room)}  # in the prompt whatever the block holds
    said = entries_for(sources)
    block = remembered(
        sources=sources,
        # A statement of a turn the prompt sends whole is there already, as is a pinned turn.
        # A reply that took a suggestion stays: the suggestion may be older than the turns sent.
        entries=[e for e in said if e.kind == facts.TOOK or e.edited or e.at not in sent],
        budget=int(budget * MEMORY_SHARE),
        pinned=[t for t in pinned if t.id not in sent],
        # A correction in the turns sent still bars the summary's sentence that it replaced.
        said=said,
    )
    remaining = budget - (estimate_tokens(block.text) if block else 0)
    recent = _fill(uncovered, remaining) or [question]
    plan = Plan(
        system="\n\n".join(b for b in (system, block.text) if b),
        turns=_as_messages(reversed(recent)),
        remembered=block,
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
    newest that fit `budget`, at most SUMMARY_INPUT_TOKENS of them, oldest first. A part
    never ends on a user turn that has an answer after it: the answer is what tells whether a
    reply took one of the options offered before it (memory_proposals.confirmed_choice), and
    the turn is folded in with it next time."""
    keep = len(_fill(uncovered, budget))
    due, used = [], 0
    for turn in reversed(uncovered[max(keep, 1) :]):
        used += estimate_tokens(turn.text) if turn.role == Message.Role.USER else 0
        if due and used > SUMMARY_INPUT_TOKENS:
            break
        due.append(turn)
    # `uncovered` is newest first: the turn after the part's last is the one before it there.
    following = uncovered[len(uncovered) - len(due) - 1] if due else None
    answered = following is not None and following.role != Message.Role.USER
    if len(due) > 1 and due[-1].role == Message.Role.USER and answered:
        due.pop()
    return due


def _as_messages(turns) -> list[dict[str, str]]:
    return [{"role": t.role, "content": t.text} for t in turns]


# The turns an edit reads to find the entry it changes, as many as a prompt reads
# (prompting.HISTORY_TURNS_MAX).
EDIT_READS_TURNS = 100


@transaction.atomic
def memory_entry_edit(*, conversation: Conversation, key: str, value: str) -> bool:
    """The user corrects (or, with "", deletes) one entry of the conversation's memory, as the
    page's note shows it; False when there is no such entry. The edit is kept on the summary's
    row (one with no summary yet is made for it) and holds against every turn said so far."""
    row, _ = ConversationSummary.objects.select_for_update().get_or_create(
        conversation=conversation, defaults={"text": "", "upto_message_id": 0}
    )
    sources = selectors.prompt_sources(conversation=conversation, limit=EDIT_READS_TURNS)
    sources.facts = row.facts
    newest = conversation.messages.order_by("-created", "-id").values_list("id", flat=True)
    edited = facts.entry_edit(entries_for(sources), key=key, value=value, at=newest.first() or 0)
    if edited is None:
        return False
    kept = [e for e in facts.entries_from_json(row.facts) if e.key != key]
    row.facts = facts.entries_to_json([*kept, edited])
    row.save(update_fields=["facts"])
    return True


def summary_for(*, conversation: Conversation) -> ConversationSummary | None:
    return ConversationSummary.objects.filter(conversation=conversation).first()


def message_set_pinned(*, conversation: Conversation, message_id: int, pinned: bool) -> Message:
    """Pins or unpins one of the conversation's messages; Http404 for any other id."""
    message = get_object_or_404(Message, conversation=conversation, id=message_id)
    message.pinned = pinned
    message.save(update_fields=["pinned"])
    return message
