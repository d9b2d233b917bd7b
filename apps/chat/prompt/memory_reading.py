"""Reading the user's words for memory (memory_facts.py): sentences, whether a sentence speaks
of the user (the grammar's first person, never a list of phrasings), the names and numbers it
carries, the words that tell a list's options apart, and the options of a list. What the
assistant proposed, and a reply that takes it, is read in memory_proposals.py; what a statement
is about, as the embedding model sees it, in memory_replaced.py."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

# Readings of one text kept per process (read_sentence, detail_words, clauses_of, asserts,
# subject_of, user_is_subject): a prompt compares every pair of the conversation's statements
# (memory_replaced.replaced_by), and read again each time they took most of its building.
READINGS_CACHED = 8192

# A very long sentence is cut to its clauses that speak of the user (words, not tokens).
LONG_SENTENCE_WORDS = 32

# Sentence ends: an end mark before a space, or a line break (a decimal point is no end).
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])[\"')\]\u201d]*\s+|\s*\n+\s*")
# Clause ends: a comma, colon or dash, a conjunction, or the ellipsis `shortened` joins kept
# clauses with.
CLAUSE_END = re.compile(r"\s*(?:[,;:]\s+|\s+[-\u2013\u2014\u2026]\s+|\s+(?:but|and|so|because)\s+)")
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
# The grammar's generic person, in which people ask about themselves at one remove: an
# indefinite pronoun ("is it safe for someone with a pacemaker...?"), or "you" in a clause of
# condition ("...when you've got a septic tank?").
INDEFINITE = frozenset("someone somebody anyone anybody".split())
CONDITION = frozenset({"when", "if", "while"})
GENERIC_YOU = frozenset({"you", "you're", "you've"})


@dataclass(frozen=True)
class Sentence:
    text: str
    question: bool
    first_person: bool
    possessive: bool
    details: int  # names and numbers in it
    addressed: bool  # speaks to the assistant: "you", or "me" as in "tell me"
    generic: bool = False  # speaks of a generic person (INDEFINITE, GENERIC_YOU)

    @property
    def kept(self) -> bool:
        if len(self.text.split()) < 3:
            return False
        if self.first_person:  # "I", "my", "we": the user speaks of themselves
            return True
        if self.question:  # of a generic person, or naming something not asked of the assistant
            return self.generic or (self.details > 0 and not self.addressed)
        # Whatever else the user asserts ("marmaduke just knocked the jar off the shelf", typed
        # without a capital) tells of their life; what is said to the assistant ("Tell me
        # about river 16", "Can you explain the 1929 crash") does not. The weight ranks them.
        return not self.addressed

    @property
    def weight(self) -> float:
        """How much the sentence is likely to tell: names and numbers, then the user as its
        subject (half as much in a question: "how do I undo a push"), then a possessive, then a
        statement over a question."""
        subject = any(w.lower() in SUBJECT for w in WORD.findall(self.text.replace("\u2019", "'")))
        return (
            2.0 * min(self.details, 2)
            + (1.0 if self.question else 2.0) * subject
            + (self.possessive or self.generic)
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


@lru_cache(maxsize=READINGS_CACHED)
def read_sentence(text: str) -> Sentence:
    words = WORD.findall(text.replace("\u2019", "'"))
    lower = [w.lower() for w in words]
    # "me" or "us" among the opening words, before any first-person subject: a request.
    opening = lower[:REQUEST_OPENING_WORDS]
    request = any(w in OBJECT for w in opening) and not any(w in SUBJECT for w in opening)
    # Said to the assistant: "you", or such a request ("can you explain it to me").
    addressed = request or any(w in ADDRESSED for w in lower)
    generic = any(w in INDEFINITE for w in lower) or any(
        a in CONDITION and b in GENERIC_YOU for a, b in itertools.pairwise(lower)
    )
    return Sentence(
        text=text,
        question=text.rstrip().endswith("?"),
        first_person=any(w in FIRST_PERSON for w in lower)
        or (not addressed and any(w in OBJECT for w in lower)),
        possessive=any(w in POSSESSIVE for w in lower),
        details=details(words),
        addressed=addressed,
        generic=generic,
    )


def sentences_of(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s and s.strip()]


def shortened(sentence: Sentence) -> str:
    """A long sentence cut to its clauses that are worth keeping, joined by "…"."""
    if len(sentence.text.split()) <= LONG_SENTENCE_WORDS:
        return sentence.text
    clauses = [c for c in CLAUSE_END.split(sentence.text) if c and c.strip()]
    kept = [c.strip() for c in clauses if read_sentence(c).kept or details(WORD.findall(c))]
    return " \u2026 ".join(kept) if kept else sentence.text


@lru_cache(maxsize=READINGS_CACHED)
def clauses_of(text: str) -> tuple[str, ...]:
    """The clauses of a sentence that have at least three words (the sentence itself when
    none has)."""
    clauses = [c.strip() for c in CLAUSE_END.split(text) if c and len(c.split()) >= 3]
    return tuple(clauses) or (text,)


@lru_cache(maxsize=READINGS_CACHED)
def asserts(text: str) -> bool:
    """The sentence says that something is so: a statement, or a question that says it on the
    way ("I sold my bike so budget's now $650, should I get two?"): a clause before the
    question's last speaks of the user and is no condition ("if I move, ...")."""
    if not read_sentence(text).question:
        return True
    return any(_states_of_the_user(clause) for clause in clauses_of(text)[:-1])


def _states_of_the_user(clause: str) -> bool:
    """A clause in the first person that does not open with a condition ("if I move")."""
    words = WORD.findall(clause.lower())
    return bool(words) and words[0] not in CONDITION and read_sentence(clause).first_person


def detail_words_of(words: list[str]) -> list[str]:
    return [
        w
        for index, w in enumerate(words)
        if any(c.isdigit() for c in w)
        or (index > 0 and w[0].isupper() and w.lower() not in FIRST_PERSON)
    ]


# Numbers written as words are values as much as digits are ("three to six players" after "2-4
# players"): the grammar's cardinals, not "one", which is as often a pronoun ("the red one").
NUMBER_WORDS = frozenset(
    "two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety "
    "hundred thousand million dozen".split()
)


@lru_cache(maxsize=READINGS_CACHED)
def value_words(text: str) -> tuple[str, ...]:
    """The names and numbers in `text`, numbers written as words included: what a correction
    puts in place of the old value (memory_replaced.py)."""
    words = WORD.findall(text.replace("\u2019", "'"))
    masked = set(detail_words_of(words))
    return tuple(w for w in words if w in masked or is_number_word(w))


def is_number_word(word: str) -> bool:
    """A cardinal written as a word, or compounded with hyphens ("sixty-eight", "thirty-one":
    "one" only after another, as "one-off" is no number)."""
    first, *rest = word.lower().split("-")
    return first in NUMBER_WORDS and all(part in NUMBER_WORDS or part == "one" for part in rest)


@lru_cache(maxsize=READINGS_CACHED)
def detail_words(text: str) -> tuple[str, ...]:
    """The names and numbers in `text` (as _details counts them)."""
    return tuple(detail_words_of(WORD.findall(text.replace("\u2019", "'"))))


# -- what a statement is about ------------------------------------------------------------------


def vectors_forget() -> None:
    """Empties the caches of vectors and readings (bench/memory.py times a cold prompt)."""
    from apps.rag.embeddings import embed_cached_forget

    embed_cached_forget()
    for cached in (
        read_sentence,
        clauses_of,
        detail_words,
        value_words,
        asserts,
        telling_words,
    ):
        cached.cache_clear()


# -- the words that tell options apart (memory_proposals.py) -------------------------------------

# Words that point back at something said before ("that one", "love it").
ANAPHORS = frozenset("that that's it it's those them one".split())
# An option taken by its place in a list ("the second", "number two", "the last one").
POSITIONS = frozenset(
    "first second third fourth fifth last latter former two three four five".split()
)
# The pro-form a choice among options takes ("the blue one", "the one north of the station").
CHOICE = frozenset({"one", "ones"})

# Numbers written as words, as digits: "the twelve weeks one" names "12-week polarised plan".
_TWO_TO_TWENTY = (
    "two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
)
_TENS = "thirty forty fifty sixty seventy eighty ninety"
_NUMBERS = {
    **{w: str(n) for n, w in enumerate(_TWO_TO_TWENTY.split(), 2)},
    **{w: str(n) for w, n in zip(_TENS.split(), range(30, 100, 10), strict=True)},
}
# A word shorter than this tells options apart only as a number ("go with the app" is no name).
TELLING_CHARS = 4


@lru_cache(maxsize=READINGS_CACHED)
def telling_words(text: str) -> frozenset[str]:
    """The words of `text` as options are told apart: lower-cased, split at hyphens and dots
    ("12-week", "B.Des"), a plural's "s" dropped ("the gravdals"), numbers written as words
    as digits; places in a list and pro-forms left out (the position rules read those)."""
    words = set()
    for written in re.findall(r"[^\W_]+", text):
        word = _NUMBERS.get(written.lower(), written.lower())
        if word in POSITIONS | CHOICE | ANAPHORS:
            continue
        if len(word) > TELLING_CHARS and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        if word.isdigit() or len(word) >= TELLING_CHARS or _acronym(written):
            words.add(word)
    return frozenset(words)


def _acronym(word: str) -> bool:
    """A short word in capitals names something ("WBC", "NHS"): it tells options apart."""
    return len(word) >= 2 and word.isupper()


# -- the options of a list the assistant wrote ---------------------------------------------------
# Whatever its layout: numbered, lettered or bulleted items, headings, a Markdown table's rows or
# columns, options in prose set apart by dashes or semicolons; each option's head (what it is
# called), read by memory_proposals.py.

_LIST_ITEM = re.compile(
    r"(?:^[ \t]*(?:[-*\u2022\u2013\u2014]|\(?[A-Ha-h][.)])|(?:^|(?<=\s))(?:\*\*|__)?\d{1,2}[.)])"
    r"[ \t]+(.+?)"
    r"(?=\s\d{1,2}[.)]\s|$)",
    re.MULTILINE,
)
# An item's head ends at its first dash, comma, colon or bracket ("**Kittiwake** - a seabird"),
# or where its first sentence ends ("**Ventilation.** Garage door open"): what follows describes
# the option, and its words would name it by chance. "St. Albans" is no sentence's end.
_ITEM_HEAD_END = re.compile(r"\s+[-\u2013\u2014]\s+|[,:(]|(?<=\w\w\w)[.!?]\s+(?=[A-Z])")
ITEM_HEAD_WORDS = 6
# A head that is only a label and its index: one word, then a letter or a number.
_LABEL = re.compile(r"^\w+\s+(?:[A-Za-z]|\d{1,2})$")


# Options written in prose, each a head and a description set apart by a dash, one per
# sentence or semicolon: "Some ideas: Ledgerline — suggests tracking. Mortise — a joint."
_INLINE_SEGMENT_END = re.compile(r"(?<=[.!?;])\s+|\s*\n+\s*")
_INLINE_ITEM = re.compile(r"^(?:[^:\u2014\u2013]{0,120}:\s+)?(.{1,80}?)\s+[-\u2013\u2014]\s+\S")


# The last of options in a sentence: "...; or a crescent moon", "...; or even X".
_LAST_OPTION = re.compile(r"^(?:or(?:\s+else|\s+even)?|and\s+finally)\s+", re.IGNORECASE)


# A Markdown table's delimiter row, under its header: hyphens between pipes ("|---|:--:|",
# "--- | ---", "| --- |"); a lone "---" is a horizontal rule, not a table.
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)+\|?\s*$|^\s*\|\s*:?-+:?\s*\|\s*$")


# A line that is a heading: Markdown's "#", or bold as a whole ("**2. Higdon Plan**", "**Emerald
# & Ivory** \U0001f49a"), with nothing but marks after it.
_HEADING = re.compile(
    r"^[ \t]*(?:#{1,4}[ \t]+(.{2,80}?)|(?:\*\*|__)(.{2,80}?)(?:\*\*|__)[^\w\n]*)$", re.MULTILINE
)


def _headings(assistant_text: str) -> list[str]:
    """The headings of the turn's sections: when there are several, the options it lays out,
    each with its details below it (the bullets under a heading are not options)."""
    found = [(a or b).strip() for a, b in _HEADING.findall(assistant_text)]
    return [re.sub(r"^\d{1,2}[.)]\s*", "", heading) for heading in found]


def _table_rows(assistant_text: str) -> list[str]:
    """The first cells of a Markdown table's rows below its header: one option per row; or,
    when the header's first cell is empty, the header's cells: one option per column."""
    lines = assistant_text.splitlines()
    rows = []
    for index, line in enumerate(lines):
        if index and _TABLE_RULE.match(line) and "|" in lines[index - 1]:
            header = [cell.strip() for cell in lines[index - 1].strip().strip("|").split("|")]
            if len(header) > 2 and not header[0]:
                return [cell for cell in header[1:] if cell]
            for row in lines[index + 1 :]:
                if "|" not in row:
                    break
                cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
                if cells and cells[0]:
                    rows.append(cells[0])
            break
    return rows


def _items(assistant_text: str) -> list[str]:
    """The items of a list the assistant wrote, each whole: bulleted or numbered, a Markdown
    table's rows, or written in prose as heads with dashed descriptions or in one sentence
    between semicolons."""
    items = _headings(assistant_text)
    if len(items) < 2:
        items = [match.group(1) for match in _LIST_ITEM.finditer(assistant_text)]
    if len(items) < 2:
        items = _table_rows(assistant_text)
    if len(items) < 2:
        segments = _INLINE_SEGMENT_END.split(assistant_text)
        items = [
            segment[m.start(1) :] for segment in segments if (m := _INLINE_ITEM.match(segment))
        ]
    if len(items) < 2:
        items = _items_in_a_sentence(assistant_text)
    return items


def _items_in_a_sentence(assistant_text: str) -> list[str]:
    """Options listed in one sentence, set apart by semicolons, the last after "or" or the
    list after an introduction that ends in a colon: "A few ideas: Queen Boudicca, for a
    warrior; Henrietta Pankhurst, a campaigner; or Lady Cluckington, if she is more of a
    duchess." Each item whole, its introduction left out. Steps or remarks strung together by
    semicolons ("rest it; ice it; see a doctor") offer nothing to choose from, nor do code or
    style rules, whose parts carry colons or brackets of their own."""
    for sentence in sentences_of(assistant_text):
        parts = [part.strip() for part in sentence.split(";")]
        if len(parts) < 2 or not all(parts):
            continue
        introduced, _, first = parts[0].rpartition(": ")
        last_is_option = bool(_LAST_OPTION.match(parts[-1]))
        if not (last_is_option or (introduced and len(parts) >= 3)):
            continue
        if any(mark in part for part in parts[1:] for mark in ":{}()[]=<>"):
            continue
        items = [first.strip(), *parts[1:-1], _LAST_OPTION.sub("", parts[-1]).rstrip(".!?")]
        items = [item for item in items if item]
        if len(items) >= 2:
            return items
    return []


def item_heads(assistant_text: str) -> list[str]:
    """The heads of a list the assistant wrote (_items), one per item: what each option is
    called. An item called by a label and its index ("Route B - Southern Lakes: ...",
    "**Option 3 — Kalahari Dusk:**") keeps the name that follows the label."""
    heads = []
    for item in _items(assistant_text):
        item = item.replace("**", "").replace("__", "")  # bold inside the head
        parts = [part.strip(' *_`";') for part in _ITEM_HEAD_END.split(item, maxsplit=2)]
        head = " ".join(parts[0].split()[:ITEM_HEAD_WORDS])
        if _LABEL.match(head) and len(parts) > 1 and parts[1]:
            # The label takes none of the name's words.
            head = f"{head} \u2013 {' '.join(parts[1].split()[:ITEM_HEAD_WORDS])}"
        heads.append(head)
    return [h for h in heads if h]
