"""Which of the user's statements a newer one replaces (memory_facts.merge): the embedding
model's similarity of their closest clauses, names and numbers masked (subject_of),
plus how alike the names and numbers are that differ between them, each number read with what it
counts ("$265" is like "$210 per month", not "7 kW"). Never a list of attributes or phrasings:
"we're in Tartu now" replaces "I live in Tallinn" because both speak of where.

A replaced statement is not deleted: the prompt shows it as earlier (it may be out of date), so
a guess costs a hedge on a true line, never a fact. bench/memory.py counts both sides: old values
shown as current, and current values shown only as earlier.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import numpy as np

from apps.chat.prompt import memory_reading as reading
from apps.chat.prompt.memory_reading import OBJECT, READINGS_CACHED, SUBJECT, WORD

# Two statements whose closest clauses' embeddings are at least this similar speak of the same
# thing: the older is shown as earlier. Higher when only one of the two has the user as its
# subject ("I ..." against "My sister ..."). Chosen on the dev and tuning sets (bench/memory.py
# --set dev / tuning; docs/benchmarks.md has the figures): lower shows fewer old values as
# current and more current ones as earlier.
SAME_SUBJECT = 0.3
SAME_SUBJECT_OTHER_PERSON = 0.45
# Added to that similarity, times how alike the two statements' differing names and numbers
# are: a correction puts a value of the same kind where the old one was.
VALUE_WEIGHT = 0.5


class Statement(Protocol):
    key: str
    value: str
    at: int


# -- what a statement is about ------------------------------------------------------------------


def vectors_of(texts: list[str]) -> np.ndarray:
    """Unit vectors of `texts`, each embedded once per process (every prompt of a
    conversation reads its statements again)."""
    from apps.rag.embeddings import embed_cached

    return embed_cached(texts)


@lru_cache(maxsize=READINGS_CACHED)
def user_is_subject(text: str) -> bool:
    """The sentence speaks of the user as "I" or "we", or as "me" or "us" other than in a
    request ("they moved me"), not only of something of theirs ("My sister ...")."""
    lower = {w.lower() for w in WORD.findall(text.replace("\u2019", "'"))}
    first_person = bool(lower & OBJECT) and reading.read_sentence(text).first_person
    return bool(lower & SUBJECT) or first_person


@lru_cache(maxsize=READINGS_CACHED)
def subject_of(text: str) -> str:
    """The statement with its names and numbers masked: what it says something about, not the
    value it says ("I live in Tucson" and "we're in Tallinn now" both speak of where)."""
    words = WORD.findall(text.replace("\u2019", "'"))
    masked = set(reading.value_words(text))
    return " ".join("something" if w in masked else w for w in words)


def replaced_forget() -> None:
    """Empties the caches of what statements are about (bench/memory.py: a cold prompt)."""
    user_is_subject.cache_clear()
    subject_of.cache_clear()
    measured_values.cache_clear()


def _subject_vectors(statements: Sequence[Statement]) -> list:
    """Each statement's clauses as the embedding model sees them, names and numbers masked: a
    long sentence speaks of several things, and a correction matches the clause it corrects,
    not the whole sentence around it."""
    clauses = [reading.clauses_of(s.value) for s in statements]
    flat = [subject_of(c) for group in clauses for c in group]
    vectors = vectors_of(flat)
    out, start = [], 0
    for group in clauses:
        out.append(vectors[start : start + len(group)])
        start += len(group)
    return out


# A currency sign before a number belongs to it.
_CURRENCY = "$\u00a3\u20ac\u00a5"


@lru_cache(maxsize=READINGS_CACHED)
def measured_values(text: str) -> tuple[tuple[str, str], ...]:
    """Each of value_words(text) with what it is a value of: a number with its currency sign
    and the word after it ("$210 per", "7 kW", "fourteen years"), a name as it is. A
    correction's number is of the kind it replaces: "$265" is as unlike "7 kW" as "$210" is
    like it, where the bare numbers are all alike to the embedding model."""
    text = text.replace("\u2019", "'")
    values = set(reading.value_words(text))
    matches = list(WORD.finditer(text))
    found = []
    for index, match in enumerate(matches):
        word = match.group()
        if word not in values:
            continue
        if any(c.isdigit() for c in word) or reading.is_number_word(word):
            before = text[match.start() - 1 : match.start()]
            sign = before if before and before in _CURRENCY else ""
            after = matches[index + 1].group() if index + 1 < len(matches) else ""
            found.append((word, f"{sign}{word} {after}".strip()))
        else:
            found.append((word, word))
    return tuple(found)


def _value_likeness(new: Statement, old: Statement, words: dict[str, object]) -> float:
    """How alike the names and numbers of two statements are that differ between them ("90
    guests" and "140 people", "N5" and "N4", "Madeira" and "Lanzarote"), numbers with what they
    count (measured_values). `words`: each value's vector."""
    said_new = measured_values(new.value)
    said_old = measured_values(old.value)
    pairs = [(n, o) for w, n in said_new for v, o in said_old if w.lower() != v.lower()]
    return max((float(words[n] @ words[o]) for n, o in pairs), default=0.0)


def _same_subject(a, b) -> bool:
    """Two statements' clause vectors (_subject_vectors) speak of the same thing."""
    return float((a @ b.T).max()) >= SAME_SUBJECT


def replaced_by(
    older: Sequence[Statement], newest: Sequence[Statement], asking: Sequence[bool]
) -> list[tuple[int, int]]:
    """(index in `older`, index in `newest`) for each older statement of another turn that a
    newest one replaces: their closest clauses, plus VALUE_WEIGHT times how alike their
    differing names and numbers are, reach SAME_SUBJECT. `asking`, one per newest: a question
    that asserts nothing (memory_reading.asserts) replaces nothing. The closest is found for each
    clause of the newest statement, as one sentence may speak of two things; and every older
    one that says what a closest says is replaced with it: what a correction replaces was often
    said more than once, and a copy left unmarked reads as current."""
    if not older or not newest:
        return []
    vectors = _subject_vectors([*older, *newest])
    old_vectors, new_vectors = vectors[: len(older)], vectors[len(older) :]
    details = sorted({m for s in [*older, *newest] for _, m in measured_values(s.value)})
    words = dict(zip(details, vectors_of(details), strict=True)) if details else {}
    found = []
    for row, (statement, new, asks) in enumerate(zip(newest, new_vectors, asking, strict=True)):
        if asks:
            continue
        cols = [
            col
            for col, old in enumerate(older)
            if old.at != statement.at and old.key != statement.key
        ]
        if not cols:
            continue
        subject = user_is_subject(statement.value)
        likeness = {
            col: VALUE_WEIGHT * _value_likeness(statement, older[col], words) for col in cols
        }
        # Per clause of the newest statement: in "Tomasz came by and helped me split a colony,
        # so I have three hives now" the line closest to the first clause speaks of Tomasz, and
        # the hives would go unmarked, shown as current.
        by_clause = {col: (new @ old_vectors[col].T).max(axis=1) + likeness[col] for col in cols}
        linked = set()
        for clause in range(len(new)):
            closest = max(cols, key=lambda col: by_clause[col][clause])
            for col in cols:
                same_person = user_is_subject(older[col].value) == subject
                bar = SAME_SUBJECT if same_person else SAME_SUBJECT_OTHER_PERSON
                if by_clause[col][clause] < bar or col in linked:
                    continue
                if col == closest or _same_subject(old_vectors[col], old_vectors[closest]):
                    linked.add(col)
                    found.append((col, row))
    return found
