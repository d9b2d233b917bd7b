"""Reading the user's words for memory (memory_facts.py): sentences, whether a sentence speaks
of the user (the grammar's first person, never a list of phrasings), the names and numbers it
carries, and what it is about as the embedding model sees it (subject_of). What the assistant
proposed, and a reply that takes it, is read in memory_proposals.py."""

from __future__ import annotations

import itertools
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Readings of one text kept per process (read_sentence, detail_words, clauses_of, asserts,
# subject_of, user_is_subject): a prompt compares every pair of the conversation's statements
# (memory_replaced.replaced_by), and read again each time they took most of its building.
READINGS_CACHED = 8192

# A very long sentence is cut to its clauses that speak of the user (words, not tokens).
LONG_SENTENCE_WORDS = 32

# Sentence ends: an end mark before a space, or a line break (a decimal point is no end).
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])[\"')\]\u201d]*\s+|\s*\n+\s*")
CLAUSE_END = re.compile(r"\s*(?:[,;:]\s+|\s+[-\u2013\u2014]\s+|\s+(?:but|and|so|because)\s+)")
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
    """Empties the caches of vectors and readings (bench/memory.py times a cold prompt)."""
    with _vectors_lock:
        _VECTORS.clear()
    for cached in (
        read_sentence,
        clauses_of,
        detail_words,
        value_words,
        asserts,
        user_is_subject,
        subject_of,
    ):
        cached.cache_clear()


@lru_cache(maxsize=READINGS_CACHED)
def user_is_subject(text: str) -> bool:
    """The sentence speaks of the user as "I" or "we", or as "me" or "us" other than in a
    request ("they moved me"), not only of something of theirs ("My sister ...")."""
    lower = {w.lower() for w in WORD.findall(text.replace("\u2019", "'"))}
    return bool(lower & SUBJECT) or (bool(lower & OBJECT) and read_sentence(text).first_person)


@lru_cache(maxsize=READINGS_CACHED)
def subject_of(text: str) -> str:
    """The statement with its names and numbers masked: what it says something about, not the
    value it says ("I live in Tucson" and "we're in Tallinn now" both speak of where)."""
    words = WORD.findall(text.replace("\u2019", "'"))
    masked = set(value_words(text))
    return " ".join("something" if w in masked else w for w in words)
