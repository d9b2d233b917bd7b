"""Reading the user's words for memory (memory_facts.py): sentences, whether a sentence speaks
of the user (the grammar's first person, never a list of phrasings), the names and numbers it
carries, what it is about as the embedding model sees it (subject_of), and whether a turn takes
what the assistant proposed (suggestion_taken: a list's item heads, the names a proposal gives,
a reply that points back, names a place in a list or repeats a name)."""

from __future__ import annotations

import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A very long sentence is cut to its clauses that speak of the user (words, not tokens).
LONG_SENTENCE_WORDS = 32

# Sentence ends: an end mark before a space, or a line break (a decimal point is no end).
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])[\"')\]\u201d]*\s+|\s*\n+\s*")
_CLAUSE_END = re.compile(r"\s*(?:[,;:]\s+|\s+[-\u2013\u2014]\s+|\s+(?:but|and|so|because)\s+)")
WORD = re.compile(r"[\w][\w'\u2019-]*")
# The grammar's first person: subject and possessive forms. The object forms ("me", "us") speak
# of the user too ("they moved me to Thursdays"), except in what is said to the assistant: a
# sentence with "you", or a request that opens with them ("Tell me about...", "help us...").
FIRST_PERSON = frozenset(
    "i i'm im i've ive i'd i'll my mine myself we we're we've we'd we'll our ours".split()
)
POSSESSIVE = frozenset({"my", "mine", "our", "ours"})
SUBJECT = FIRST_PERSON - POSSESSIVE
OBJECT = frozenset({"me", "us"})
ADDRESSED = frozenset("you your you're yours".split())
# How far into a sentence "me" or "us" is still the object of a request that opens it.
REQUEST_OPENING_WORDS = 3
# Words that point back at something said before ("that one", "love it").
ANAPHORS = frozenset("that that's it it's those them one".split())
# An option taken by its place in a list ("the second", "number two", "the last one").
POSITIONS = frozenset(
    "first second third fourth fifth last latter former two three four five".split()
)
# The pro-form a choice among options takes ("the blue one", "the one north of the station").
CHOICE = frozenset({"one", "ones"})


@dataclass(frozen=True)
class Sentence:
    text: str
    question: bool
    first_person: bool
    possessive: bool
    details: int  # names and numbers in it
    addressed: bool  # speaks to the assistant: "you", or "me" as in "tell me"

    @property
    def kept(self) -> bool:
        if len(self.text.split()) < 3:
            return False
        if self.question:  # a question that says something of the user, or names something
            named = self.details > 0 and (self.first_person or not self.addressed)
            return self.possessive or named
        # A name or a number alone counts in a statement, not in what is said to the
        # assistant ("Tell me about river 16", "Can you explain the 1929 crash").
        return self.first_person or (self.details > 0 and not self.addressed)

    @property
    def weight(self) -> float:
        """How much the sentence is likely to tell: names and numbers, then the user as its
        subject, then a possessive, then a statement over a question."""
        subject = any(w.lower() in SUBJECT for w in WORD.findall(self.text.replace("\u2019", "'")))
        return (
            2.0 * min(self.details, 2)
            + 2.0 * subject
            + self.possessive
            + (0.5 if not self.question else 0.0)
        )


def details(words: list[str]) -> int:
    """Names (capitalised past the first word, not "I") and numbers."""
    found = 0
    for index, word in enumerate(words):
        if any(c.isdigit() for c in word):
            found += 1
        elif index > 0 and word[0].isupper() and word.lower() not in FIRST_PERSON:
            found += 1
    return found


def read_sentence(text: str) -> Sentence:
    words = WORD.findall(text.replace("\u2019", "'"))
    lower = [w.lower() for w in words]
    # "me" or "us" among the opening words, before any first-person subject: a request.
    opening = lower[:REQUEST_OPENING_WORDS]
    request = any(w in OBJECT for w in opening) and not any(w in SUBJECT for w in opening)
    # Said to the assistant: "you", or such a request ("can you explain it to me").
    addressed = request or any(w in ADDRESSED for w in lower)
    return Sentence(
        text=text,
        question=text.rstrip().endswith("?"),
        first_person=any(w in FIRST_PERSON for w in lower)
        or (not addressed and any(w in OBJECT for w in lower)),
        possessive=any(w in POSSESSIVE for w in lower),
        details=details(words),
        addressed=addressed,
    )


def sentences_of(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s and s.strip()]


def shortened(sentence: Sentence) -> str:
    """A long sentence cut to its clauses that are worth keeping, joined by "…"."""
    if len(sentence.text.split()) <= LONG_SENTENCE_WORDS:
        return sentence.text
    clauses = [c for c in _CLAUSE_END.split(sentence.text) if c and c.strip()]
    kept = [c.strip() for c in clauses if read_sentence(c).kept or details(WORD.findall(c))]
    return " \u2026 ".join(kept) if kept else sentence.text


def clauses_of(text: str) -> list[str]:
    """The clauses of a sentence that have at least three words (the sentence itself when
    none has)."""
    clauses = [c.strip() for c in _CLAUSE_END.split(text) if c and len(c.split()) >= 3]
    return clauses or [text]


def detail_words_of(words: list[str]) -> list[str]:
    return [
        w
        for index, w in enumerate(words)
        if any(c.isdigit() for c in w)
        or (index > 0 and w[0].isupper() and w.lower() not in FIRST_PERSON)
    ]


def detail_words(text: str) -> list[str]:
    """The names and numbers in `text` (as _details counts them)."""
    return detail_words_of(WORD.findall(text.replace("\u2019", "'")))


# -- what a statement is about ------------------------------------------------------------------

_VECTORS: OrderedDict[str, np.ndarray] = OrderedDict()
_VECTORS_KEPT = 4096
_vectors_lock = threading.Lock()


def vectors(texts: list[str]) -> np.ndarray:
    """Unit vectors of `texts`, each embedded once per process (every prompt of a
    conversation reads its statements again); the least recently used leave first."""
    from apps.rag.embeddings import embed_texts

    if not texts:
        return np.zeros((0, 1))
    found: dict[str, np.ndarray] = {}
    with _vectors_lock:
        for text in dict.fromkeys(texts):
            if text in _VECTORS:
                _VECTORS.move_to_end(text)
                found[text] = _VECTORS[text]
    missing = [t for t in dict.fromkeys(texts) if t not in found]
    if missing:
        computed = embed_texts(missing)
        found.update(zip(missing, computed, strict=True))
        with _vectors_lock:
            for text, vector in zip(missing, computed, strict=True):
                _VECTORS[text] = vector
            while len(_VECTORS) > _VECTORS_KEPT:
                _VECTORS.popitem(last=False)
    # From this call's own copies: another call may have evicted them from the cache meanwhile.
    return np.stack([found[t] for t in texts])


def vectors_forget() -> None:
    """Empties the cache of vectors (bench/memory.py times a cold prompt)."""
    with _vectors_lock:
        _VECTORS.clear()


def user_is_subject(text: str) -> bool:
    """The sentence speaks of the user as "I" or "we", or as "me" or "us" other than in a
    request ("they moved me"), not only of something of theirs ("My sister ...")."""
    lower = {w.lower() for w in WORD.findall(text.replace("\u2019", "'"))}
    return bool(lower & SUBJECT) or (bool(lower & OBJECT) and read_sentence(text).first_person)


def subject_of(text: str) -> str:
    """The statement with its names and numbers masked: what it says something about, not the
    value it says ("I live in Tucson" and "we're in Tallinn now" both speak of where)."""
    words = WORD.findall(text.replace("\u2019", "'"))
    masked = set(detail_words_of(words))
    return " ".join("something" if w in masked else w for w in words)


# -- what the assistant proposed, and a reply that takes it ----------------------------------

# A reply's opening this short that points back answers the assistant's turn before it (and a
# sentence that repeats one of its names, up to twice this long).
REPLY_MAX_WORDS = 14
# The assistant's suggestion kept with such a reply (characters).
SUGGESTION_CHARS = 200
_LIST_ITEM = re.compile(
    r"(?:^[ \t]*(?:[-*\u2022\u2013\u2014]|\(?[A-Ha-h][.)])|(?:^|(?<=\s))\d{1,2}[.)])[ \t]+(.+?)"
    r"(?=\s\d{1,2}[.)]\s|$)",
    re.MULTILINE,
)
# An item's head ends at its first dash, comma, colon or bracket: "**Kittiwake** - a seabird".
_ITEM_HEAD_END = re.compile(r"\s+[-\u2013\u2014]\s+|[,:(]")
ITEM_HEAD_WORDS = 6
# A head that is only a label and its index: one word, then a letter or a number.
_LABEL = re.compile(r"^\w+\s+(?:[A-Za-z]|\d{1,2})$")
_HIGHLIGHTED = re.compile(r"(?:\*\*|[\"\u201c`])([^*\"\u201d`\n]{1,40})(?:\*\*|[\"\u201d`])")


# Options written in prose, each a head and a description set apart by a dash, one per
# sentence or semicolon: "Some ideas: Ledgerline — suggests tracking. Mortise — a joint."
_INLINE_SEGMENT_END = re.compile(r"(?<=[.!?;])\s+|\s*\n+\s*")
_INLINE_ITEM = re.compile(r"^(?:[^:\u2014\u2013]{0,120}:\s+)?(.{1,80}?)\s+[-\u2013\u2014]\s+\S")


# A Markdown table's delimiter row, under its header: hyphens between pipes ("|---|:--:|",
# "--- | ---", "| --- |"); a lone "---" is a horizontal rule, not a table.
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)+\|?\s*$|^\s*\|\s*:?-+:?\s*\|\s*$")


def _table_rows(assistant_text: str) -> list[str]:
    """The first cells of a Markdown table's rows below its header: one option per row."""
    lines = assistant_text.splitlines()
    rows = []
    for index, line in enumerate(lines):
        if index and _TABLE_RULE.match(line) and "|" in lines[index - 1]:
            for row in lines[index + 1 :]:
                if "|" not in row:
                    break
                cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
                if cells and cells[0]:
                    rows.append(cells[0])
            break
    return rows


def _item_heads(assistant_text: str) -> list[str]:
    """The heads of a list the assistant wrote, one per item: what each option is called. A
    list is bulleted or numbered, a Markdown table's rows, or written in prose as heads with
    dashed descriptions. An item called by a label and its index ("Route B - Southern Lakes:
    ...", "**Option 3 — Kalahari Dusk:**") keeps the name that follows the label."""
    items = [match.group(1) for match in _LIST_ITEM.finditer(assistant_text)]
    if len(items) < 2:
        items = _table_rows(assistant_text)
    if len(items) < 2:
        segments = _INLINE_SEGMENT_END.split(assistant_text)
        items = [
            segment[m.start(1) :] for segment in segments if (m := _INLINE_ITEM.match(segment))
        ]
    heads = []
    for item in items:
        parts = [part.strip(' *_`";') for part in _ITEM_HEAD_END.split(item, maxsplit=2)]
        head = parts[0]
        if _LABEL.match(head) and len(parts) > 1 and parts[1]:
            head = f"{head} \u2013 {parts[1]}"
        heads.append(" ".join(head.split()[:ITEM_HEAD_WORDS]))
    return [h for h in heads if h]


def _suggestion(assistant_text: str) -> tuple[str, bool]:
    """What the assistant proposed, and whether it named something: a list's item heads,
    numbered, when it wrote a list (an option taken by its place, "the second one", stays
    findable); else its sentences with a name, a number, a quoted or a highlighted word; else
    its first sentences; up to SUGGESTION_CHARS."""
    heads = _item_heads(assistant_text)
    if len(heads) >= 2:
        listed = "; ".join(f"{n}. {head}" for n, head in enumerate(heads, 1))
        return listed[:SUGGESTION_CHARS], True
    sentences = [raw.strip(" -*\u2022\t") for raw in sentences_of(assistant_text)]
    marked = [
        s
        for raw, s in zip(sentences_of(assistant_text), sentences, strict=True)
        if re.search(r"[\"\u201c*`]", raw) or details(WORD.findall(s))
    ]
    picked, used = [], 0
    for sentence in marked or sentences:
        if picked and used + len(sentence) > SUGGESTION_CHARS:
            break
        picked.append(sentence[:SUGGESTION_CHARS])
        used += len(sentence) + 1
    return " ".join(picked), bool(marked)


def _proposed_names(assistant_text: str) -> set[str]:
    """What names what the assistant proposed: the names in a list's item heads (their first
    word too when it is the only name in the head) and every pair of words in a row in a head
    ("keepsake box"), highlighted or quoted words, and the names in its sentences (capitalised
    past a sentence's first word). Single words and pairs, lower-cased."""
    names = set()
    for head in _item_heads(assistant_text):
        words = WORD.findall(head)
        capitalised = [w for w in words if w[0].isupper()]
        names.update(capitalised if len(capitalised) == 1 else capitalised[1:])
        names.update(f"{a} {b}" for a, b in itertools.pairwise(words))
    for quoted in _HIGHLIGHTED.findall(assistant_text):
        names.update(WORD.findall(quoted))
    for sentence in sentences_of(assistant_text):
        names.update(w for w in detail_words(sentence) if not w.isdigit())
    return {w.lower() for w in names if len(w) > 3}


def _said_names(sentence: str) -> set[str]:
    """The sentence's words and pairs of words in a row, lower-cased (as _proposed_names)."""
    words = [w.lower() for w in WORD.findall(sentence)]
    return {*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))}


def _lists(previous_assistant: str, earlier: Sequence[str]) -> list[str]:
    """The assistant's turns that gave a list of options, newest first."""
    return [a for a in [previous_assistant, *earlier] if a and len(_item_heads(a)) >= 2]


def suggestion_taken(
    text: str, previous_assistant: str, earlier: Sequence[str] = ()
) -> tuple[str, str] | None:
    """A turn that takes what the assistant proposed: its opening is a short reply (not a
    question) to a list of options the turn just before it gave, in any words; or a short
    reply that points back at that turn and says nothing of its own ("Perfect, going with
    that one."); or one of its statements repeats a name that turn or one of the `earlier`
    assistant turns (newest first) proposed ("kittiwake it is", said after a question about
    the options). That sentence is kept with the proposal, since a reply alone says nothing.
    Whatever else the turn says is read as usual; an acknowledgement ("Thank you.", "Ok.")
    after anything but a list takes nothing."""
    sentences = sentences_of(text)
    opening = next(iter(sentences), "")
    reply, taken = "", ""
    words = opening.split()
    if (
        previous_assistant
        and words
        and len(words) <= REPLY_MAX_WORDS
        and not read_sentence(opening).question
    ):
        said = {w.lower() for w in WORD.findall(opening.replace("\u2019", "'"))}
        if len(_item_heads(previous_assistant)) >= 2:
            # A short reply to a list of options answers it, in whatever words or language
            # ("Option 3 for sure", "vamos con la segunda", "2\ufe0f\u20e3"): kept with the
            # options, so the reply and the list together say which was taken.
            reply, taken = opening, previous_assistant
        elif said & ANAPHORS and not details(WORD.findall(opening)):
            # Pointing back and saying nothing of its own; "wait, it's July 27" is a statement.
            reply, taken = opening, previous_assistant
        elif (
            said & POSITIONS
            and not details(WORD.findall(opening))
            and (listed := _lists(previous_assistant, earlier))
        ):
            # A place in the newest list ("ok the third then"). Without a list, or beside a
            # name or a number of its own, "two" counts something ("so two 4TB drives").
            reply, taken = opening, listed[0]
    if not reply:
        statements = [
            s
            for s in sentences
            if len(s.split()) <= REPLY_MAX_WORDS * 2 and not read_sentence(s).question
        ]
        for assistant in [previous_assistant, *earlier]:
            names = _proposed_names(assistant) if assistant else set()
            reply = next(
                (s for s in statements if names & _said_names(s)),
                "",
            )
            if reply:
                taken = assistant
                break
    if not reply:
        # A choice that names no option points at one ("we go with the blue one", "I take the
        # free one"): kept with the newest list of options, which says what it points at.
        listed = _lists(previous_assistant, earlier)
        reply = next((s for s in statements if _said_names(s) & CHOICE), "") if listed else ""
        taken = listed[0] if reply else ""
    proposal = _suggestion(taken)[0] if taken else ""
    if not reply or not proposal:
        return None
    return " ".join(reply.split()), proposal
