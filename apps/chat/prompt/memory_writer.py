"""Memory the model writes, for models the operator lets write it (MemoryWriter, per model).

After an answer, a background request (task `memory`) asks the conversation's model which of
the user's words in the turn say something about the user or their life, as JSON held to
WRITER_SCHEMA by the engine (llama.cpp's grammar, vLLM's structured outputs, `response_format`
on the `openai` engine). The model only points: each fact is a quote of the user's turn, and a
quote that is not in the turn is dropped, so nothing the model invents reaches the prompt. A
name it says the user chose must be in the assistant's previous answer.

What the model chose for a turn is kept as NOTED entries on the conversation's summary row
(one empty entry when it found nothing) and stands in for memory_facts' own reading of that
turn; a turn the model has not read yet (waiting in line, or a model that does not write
memory) is read by memory_facts as before. Which statement supersedes which is the same for
both: similarity (memory_replaced.py).
"""

from __future__ import annotations

import json
import logging
import re
import time

from django.conf import settings
from django.db import transaction

from apps.chat.models import Conversation, ConversationSummary, MemoryWriter, Message
from apps.chat.prompt import memory_facts as facts
from apps.chat.prompt.memory_facts import NOTED, Entry
from apps.chat.prompt.memory_summary import clip

log = logging.getLogger("sluice.chat.memory")

# The model's answer: quotes of the user's words, and the option of the assistant's the user
# chose ("" for none). Bounded, so a small model cannot run on.
WRITER_SCHEMA = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {"quote": {"type": "string", "maxLength": 240}},
                "required": ["quote"],
            },
        },
        "chosen": {"type": "string", "maxLength": 120},
    },
    "required": ["facts", "chosen"],
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "memory", "schema": WRITER_SCHEMA, "strict": True},
}
WRITER_MAX_TOKENS = 300
# The turns the request shows the model, clipped: the assistant's answer only for its options.
USER_TOKENS = 400
ASSISTANT_TOKENS = 300
# Quotes shorter than this say nothing a later question needs ("yes", "ok").
MIN_QUOTE_CHARS = 8

INSTRUCTIONS = (
    "You keep notes for an assistant about the person it talks to. Read the person's message "
    "and copy, word for word, each part that tells something about the person or their life "
    "that could matter later: who they are, where they live or work, what they have, like, "
    "plan or decided, what changed, and what they say of people close to them. Copy the "
    "words exactly as written; do not rephrase. Leave out greetings, thanks and questions "
    "that tell nothing about the person. If the person picks one of the assistant's options, "
    'put the option\'s name, as the assistant wrote it, in "chosen"; otherwise leave it "". '
    'Answer in JSON: {"facts": [{"quote": "..."}], "chosen": ""}.'
)


def writer_messages(*, user_text: str, assistant_text: str) -> list[dict[str, str]]:
    """The request for one user turn, with the assistant's answer before it (for its options)."""
    parts = []
    if assistant_text.strip():
        parts.append(f"The assistant's previous answer:\n{clip(assistant_text, ASSISTANT_TOKENS)}")
    parts.append(f"The person's message:\n{clip(user_text, USER_TOKENS)}")
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _found(quote: str, text: str) -> str:
    """The words of `text` that `quote` copies (case, spacing, curly apostrophes and the
    punctuation around it aside), as `text` has them; "" when they are not there."""
    straight = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'})
    words = re.findall(r"\w+|[^\w\s]", quote.translate(straight).strip(" \"'.,;:!?"))
    if not words:
        return ""
    pattern = r"(?<!\w)" + r"\s*".join(re.escape(w) for w in words) + r"(?!\w)"
    # One character for one: a match's place in the straightened text is its place in `text`.
    match = re.search(pattern, text.translate(straight), re.IGNORECASE)
    return text[match.start() : match.end()] if match else ""


def noted_from_answer(
    answer_text: str, *, user_text: str, assistant_text: str, at: int
) -> list[Entry] | None:
    """The turn's NOTED entries from the model's answer: each quote found in the user's turn,
    once, and the chosen option when the assistant's answer names it. [one empty entry] when
    the model found nothing; None when the answer is not the JSON asked for (the turn is then
    read by memory_facts as if the model had not been asked)."""
    try:
        data = json.loads(answer_text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("facts"), list):
        return None
    quotes: list[str] = []
    for item in data["facts"]:
        quote = item.get("quote") if isinstance(item, dict) else None
        said = _found(quote, user_text) if isinstance(quote, str) else ""
        if len(said) >= MIN_QUOTE_CHARS and said.lower() not in {q.lower() for q in quotes}:
            quotes.append(said)
    chosen = data.get("chosen")
    chosen = _found(chosen, assistant_text) if isinstance(chosen, str) and chosen.strip() else ""
    if chosen and not quotes:  # a choice said in words too short to quote ("that one")
        quotes.append(" ".join(user_text.split())[:200])
    noted = [Entry(f"noted:{at}:{i}", "{}", q, NOTED, at=at) for i, q in enumerate(quotes)]
    if noted:
        noted[0].context = chosen  # the reply that took the option: memory_facts.noted_read
    return noted or [Entry(f"noted:{at}:-", "{}", "", NOTED, at=at)]


@transaction.atomic
def noted_store(*, conversation_id: int, message_id: int, noted: list[Entry]) -> bool:
    """Keeps a turn's NOTED entries on the conversation's summary row (made when there is
    none yet), replacing what was noted of that turn before; False when the conversation is
    gone or its summary already covers the turn (the summary's entries speak for it)."""
    if not Conversation.objects.filter(id=conversation_id).exists():
        return False
    row, _ = ConversationSummary.objects.select_for_update().get_or_create(
        conversation_id=conversation_id, defaults={"text": "", "upto_message_id": 0}
    )
    if row.upto_message_id and message_id <= row.upto_message_id:
        return False
    kept = [
        e
        for e in facts.entries_from_json(row.facts)
        if not (e.kind == NOTED and e.at == message_id)
    ]
    row.facts = facts.entries_to_json([*kept, *noted])
    row.save(update_fields=["facts"])
    return True


# -- which models write memory ---------------------------------------------------------------

# The setting is read after every answer: kept for this long in the process that reads it.
SETTING_SECONDS = 30.0
_writers: tuple[float, frozenset[str]] = (0.0, frozenset())


def writes_memory(model: str) -> bool:
    """Whether the operator lets `model` write memory ("": the default model, named by its
    own row or by SLUICE_DEFAULT_MODEL's)."""
    names = _writer_names()
    return model in names or (not model and settings.SLUICE_DEFAULT_MODEL in names)


def any_writes_memory() -> bool:
    """Whether the operator lets any model write memory."""
    return bool(_writer_names())


def _writer_names() -> frozenset[str]:
    """The models allowed to write memory, read at most every SETTING_SECONDS."""
    global _writers
    read_at, names = _writers
    if time.monotonic() - read_at > SETTING_SECONDS:
        names = frozenset(
            MemoryWriter.objects.filter(writes_memory=True).values_list("model", flat=True)
        )
        _writers = (time.monotonic(), names)
    return names


def writers_forget() -> None:
    """The next check reads the setting again (the admin saved it)."""
    global _writers
    _writers = (0.0, frozenset())


# -- the background request -------------------------------------------------------------------


def turn_to_note(*, conversation_id: int, request_id: str) -> tuple[int, int] | None:
    """The user's turn that the answer `request_id` answers, and the assistant's answer before
    that turn (0: none), as message ids; None when the answer is not stored (any more)."""
    answer = Message.objects.filter(request_id=request_id, conversation_id=conversation_id)
    answer = answer.values_list("id", "created").first()
    if answer is None:
        return None
    before = (
        Message.objects.filter(conversation_id=conversation_id, created__lte=answer[1])
        .exclude(id=answer[0])
        .order_by("-created", "-id")
        .values_list("id", "role")[:2]
    )
    before = list(before)
    if not before or before[0][1] != Message.Role.USER:
        return None
    previous = before[1][0] if len(before) > 1 and before[1][1] == Message.Role.ASSISTANT else 0
    return before[0][0], previous


def texts_of(*, message_id: int, previous_id: int) -> tuple[str, str] | None:
    """The user's turn and the assistant's answer before it, as stored now; None when the turn
    is gone (deleted, or discarded by an edit)."""
    texts = dict(Message.objects.filter(id__in=(message_id, previous_id)).values_list("id", "text"))
    if message_id not in texts:
        return None
    return texts[message_id], texts.get(previous_id, "")


def noted_keep(
    answer_text: str, *, conversation_id: int, message_id: int, previous_id: int
) -> None:
    """Keeps what the model noted of the turn, read against the turn as it is now."""
    texts = texts_of(message_id=message_id, previous_id=previous_id)
    if texts is None:
        return  # the turn is gone
    noted = noted_from_answer(
        answer_text, user_text=texts[0], assistant_text=texts[1], at=message_id
    )
    if noted is None:
        log.info("memory of message %s: the answer was not the JSON asked for", message_id)
        return
    noted_store(conversation_id=conversation_id, message_id=message_id, noted=noted)
