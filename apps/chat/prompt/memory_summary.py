"""The rolling summary: the background request that folds turns falling out of the prompt into
it, the check that keeps only its grounded sentences, and its storage (with the user's
statements as of its last turn, memory_facts.py). memory.py decides when a summary is due and
puts it in the prompt (memory_summary_lines.py: none of its sentences that names an out-of-date
value, a detail the user did not give as their own, or what they said of another without naming
whom).

The statements carry what the user said, in their words; the summary carries what they asked
about, which no single sentence of theirs says. A model's rewrite of a fact ("The user lives in
...") is where facts went wrong (a sister's city told as the user's, "the user'm"), so the
summary is asked for topics, and a sentence that names a detail is kept only when the user gave
that detail as their own.
"""

from __future__ import annotations

import re

from django.db import transaction

from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.prompt import memory_facts as facts
from apps.chat.selectors import Turn

# The most of the conversation one summary request reads (the summariser's own window is the
# model's context too); a longer backlog is folded in over several requests.
SUMMARY_INPUT_TOKENS = 900
# Room for a few dozen short lines of notes; an answer that still runs into the cap is kept up
# to its last complete line or sentence (summary_text), never cut mid-word.
SUMMARY_MAX_TOKENS = 240

# The summariser reads what the user said, not the answers: a small model given a transcript
# continues it instead of summarising it, and the answers say little about the user.
SUMMARY_SYSTEM = "You write short notes about a user, in the third person."
SUMMARY_INSTRUCTIONS = (
    'Update the notes: one line "The user asked about: ..." listing the topics of the notes '
    "and of what the user said, in a few words each."
)


def clip(text: str, tokens: int) -> str:
    chars = max(0, tokens - 4) * 4
    return text if len(text) <= chars else text[: max(0, chars - 1)] + "…"


# -- the summary ------------------------------------------------------------------------------


def summary_messages(*, previous: str, turns: list[Turn]) -> list[dict[str, str]]:
    """The background request that folds `turns` into the previous summary: the notes so far,
    then the user's own words from the turns, then the instruction (last, where a small model
    heeds it)."""
    said = [f"- {clip(t.text, 150)}" for t in turns if t.role == Message.Role.USER]
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
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
WORDS = re.compile(r"[A-Za-z][A-Za-z'-]*|\d+")
STOP = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been it its
    this that these those there they them their he she his her not no do does did have has had
    can could would should will may might so than then too very also just about into over more
    most some any all each other such only own same what which who when where why how user
    user's users assistant assistant's mentioned said says stated asked asks notes note topics
    topic discussed talked conversation fact facts line lines summary previous new like""".split()
)
_OPENS_AS_USER = re.compile(r"^(?:i|i'm|i've|i'd|my|we|we're|our|me)\b", re.IGNORECASE)
_ADDRESSES = re.compile(r"\b(?:you|your|yours|you're|i|i'm|me|my|we|our|us)\b", re.IGNORECASE)


def stem(word: str) -> str:
    """Enough of a word to match "lives" with "live" and "working" with "work"."""
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word.rstrip("e")[:5]


def sentences(text: str) -> list[str]:
    found = []
    for match in _SENTENCE.finditer(text):
        sentence = re.sub(r"^[\s\-*\u2022\d.)]+", "", match.group()).strip()
        if len(sentence.split()) >= 3:
            found.append(sentence)
    return found


def grounded(sentence: str, source: str) -> bool:
    """Whether the summary sentence says only what `source` (the turns it summarises, and the
    notes it rewrites) says: every name and number in it occurs there, and at least two thirds
    of its other content words do (by stem)."""
    words = WORDS.findall(source)
    exact = {w.lower() for w in words}
    stems = {stem(w.lower()) for w in words}
    content = []
    for word in WORDS.findall(sentence):
        lower = word.lower()
        if lower in STOP:
            continue
        if (word.isdigit() or word[0].isupper()) and lower not in exact:
            return False
        content.append(lower)
    return sum(stem(w) in stems for w in content) * 3 >= len(content) * 2


def _echoes(sentence: str, text: str) -> bool:
    """Whether most of the sentence's content words are the summary request's own (its
    instruction or system prompt, repeated as if it were a note)."""
    own = {stem(w.lower()) for w in WORDS.findall(text) if w.lower() not in STOP}
    content = [stem(w.lower()) for w in WORDS.findall(sentence) if w.lower() not in STOP]
    return bool(content) and sum(w in own for w in content) * 2 > len(content)


# A rewrite into the third person that broke the grammar: "the user'm", "the user've".
_BROKEN = re.compile(r"\buser'(?!s\b)[a-z]", re.IGNORECASE)
# A person's pronoun before anyone is named (the user is "the user"): a turn's words about
# someone, copied ("She says movement is good."), read as the user's out of their turn.
_THIRD_PERSON = frozenset("he he's him his she she's her hers".split())


def _dangling(sentence: str) -> bool:
    words = WORDS.findall(sentence.replace("\u2019", "'"))
    for index, word in enumerate(words):
        if word.lower() in _THIRD_PERSON:
            return True
        if word.lower() == "user" or (index and word[0].isupper()):
            return False
    return False


def summary_text(*, previous: str, answer: str, finish_reason: str = "", said: str = "") -> str:
    """The stored summary: the model's notes that are grounded in what the user `said` in the
    summarised turns or in the `previous` notes, in the third person; the previous notes kept
    when none is. Notes the answer cap cut (`finish_reason` "length") end at their last
    complete line or sentence. Dropped: a note that speaks to someone or copies the user's
    first person (a small model answers the user or invents events), one that repeats the
    request's own instruction, one whose third person broke ("the user'm"), and one that says
    "she" or "he" before it names anyone (a turn's words about someone, copied)."""
    text = answer.strip()
    if finish_reason == "length":
        ends = [match.end() for match in _COMPLETE.finditer(text)]
        text = text[: ends[-1]].strip() if ends else ""
    source = f"{previous}\n{said}"
    request = f"{SUMMARY_SYSTEM} {SUMMARY_INSTRUCTIONS}"
    kept = []
    for sentence in sentences(text):
        if not grounded(sentence, source) or _echoes(sentence, request):
            continue
        if _OPENS_AS_USER.match(sentence) or _ADDRESSES.search(sentence):
            continue
        if _BROKEN.search(sentence) or _dangling(sentence):
            continue
        kept.append(sentence)
    return "\n".join(dict.fromkeys(kept)) or previous


def summary_written(
    *,
    conversation_id: int,
    upto_message_id: int,
    covered_from: int,
    previous: str,
    answer: str,
    finish_reason: str = "",
    model: str = "",
) -> ConversationSummary | None:
    """The summariser's answer stored as the conversation's summary (see summary_store), its
    notes checked against the user's words in the turns it covers."""
    turns = turns_between(conversation_id, after=covered_from, upto=upto_message_id)
    said = "\n".join(t.text for t in turns if t.role == Message.Role.USER)
    text = summary_text(previous=previous, answer=answer, finish_reason=finish_reason, said=said)
    return summary_store(
        conversation_id=conversation_id,
        upto_message_id=upto_message_id,
        text=text,
        model=model,
        covered_from=covered_from,
    )


def _order(conversation_id: int) -> dict[int, int]:
    """The conversation's messages by their place in it (created, then id)."""
    ids = Message.objects.filter(conversation_id=conversation_id).order_by("created", "id")
    return {message_id: n for n, message_id in enumerate(ids.values_list("id", flat=True))}


def turns_between(conversation_id: int, *, after: int, upto: int) -> list[Turn]:
    """The finished turns after message `after` (0: from the start) up to `upto`, in the
    conversation's order."""
    order = _order(conversation_id)
    start, end = order.get(after, -1), order.get(upto, -1)
    rows = Message.objects.filter(
        conversation_id=conversation_id,
        role__in=(Message.Role.USER, Message.Role.ASSISTANT),
        status=Message.Status.DONE,
    ).values_list("id", "role", "text")
    return sorted(
        (Turn(*row) for row in rows if start < order[row[0]] <= end), key=lambda t: order[t.id]
    )


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
    # The entries as of the summary's last turn: what they were, updated by the turns it folds
    # in (an entry the user edited since holds against the turns said before the edit).
    order = _order(conversation_id)
    stored = facts.entries_from_json(current.facts if current else [])
    read = turns_between(conversation_id, after=0, upto=upto_message_id)
    start = order.get(covered_from, -1)
    folded = [turn for turn in read if order[turn.id] > start]
    before = [turn for turn in read if order[turn.id] <= start]
    entries = facts.merge(
        stored,
        folded,
        newer=lambda turn_id, than: order.get(turn_id, -1) > order.get(than, -1),
        before=before,
    )
    # What a model noted of turns the summary does not fold in yet waits for them.
    upto = order.get(upto_message_id, -1)
    waiting = [e for e in stored if e.kind == facts.NOTED and order.get(e.at, -1) > upto]
    if current is None:
        current = ConversationSummary(conversation_id=conversation_id)
    current.text, current.upto_message_id, current.model = text, upto_message_id, model
    current.facts = facts.entries_to_json([*entries, *waiting])
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


def summary_discard_from(*, conversation_id: int, message_id: int) -> None:
    """Before an edit discards message `message_id` and every message after it: a summary whose
    last turn is among them speaks for them no more, and goes (its row keeps the user's own
    edits of the memory, if any). Which turns those are is the conversation's order, not ids:
    an answer stored with the next question may have the higher id while it comes first."""
    row = ConversationSummary.objects.select_for_update().filter(conversation_id=conversation_id)
    row = row.first()
    if row is None:
        return
    order = _order(conversation_id)
    cut = order.get(message_id, len(order))
    kept_before = next((m for m, n in order.items() if n == cut - 1), 0)
    entries = facts.entries_from_json(row.facts)
    for entry in entries:  # an edit made after the discarded turns holds from the last kept one
        if entry.edited and order.get(entry.at, -1) >= cut:
            entry.at = kept_before
    # A last turn gone already (retention keeps summaries of deleted turns) came before all.
    if order.get(row.upto_message_id, -1) < cut:
        row.facts = facts.entries_to_json(entries)
        row.save(update_fields=["facts"])
        return
    edits = [
        e for e in entries if e.edited or (e.kind == facts.NOTED and order.get(e.at, cut) < cut)
    ]
    if not edits:
        row.delete()
        return
    row.text, row.upto_message_id, row.model = "", 0, ""
    row.facts = facts.entries_to_json(edits)
    row.save()
