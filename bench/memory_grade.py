"""Grading for bench/memory.py: is a fact in a prompt with its current value, and is a summary
sentence grounded in the turns it summarises."""

from __future__ import annotations

import re
from functools import cache

from memory_data import Fact

# A sentence that names an old value beside one of these words says it is no longer current.
_FORMER = re.compile(
    r"\b(formerly|previously|used to|no longer|not any ?more|old|former|moved from|"
    r"changed from|instead of|until)\b",
    re.IGNORECASE,
)
_SENTENCES = re.compile(r"[^.!?\n]+[.!?]?")


@cache
def _value_re(value: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(value)}(s|es)?\b", re.IGNORECASE)


def has(value: str, text: str) -> bool:
    return bool(_value_re(value).search(text))


def presents_old(fact: Fact, memory_block: str) -> bool:
    """The corrected fact's old value stated as current somewhere in the memory block (the
    summary and kept lines, which sit before the turns and carry no order of their own): a
    sentence naming it without a word that marks it as past."""
    if not fact.old:
        return False
    for match in _SENTENCES.finditer(memory_block):
        sentence = match.group()
        if has(fact.old, sentence) and not _FORMER.search(sentence):
            return True
    return False


def kept(fact: Fact, memory_block: str, recent: str) -> bool:
    """The current value is in the prompt, and a corrected fact's old value is not presented
    as current. In the recent turns the old value may appear: the correction comes after it
    in the same turns, so their order says which holds."""
    if not (has(fact.value, memory_block) or has(fact.value, recent)):
        return False
    return not presents_old(fact, memory_block)


def answered(fact: Fact, answer: str) -> bool:
    return has(fact.value, answer) and not (fact.old and has(fact.old, answer))


# -- grounding -------------------------------------------------------------------------------

_STOP = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being
    it its this that these those there here he she his her they them their we our you your i me
    my mine not no yes do does did done have has had can could would should will shall may might
    must so than then too very also just about into over under out up down more most some any all
    each other such only own same again once what which who whom whose when where why how
    user user's users assistant assistant's mentioned mention said says stated states asked asks
    notes note topics topic discussed discuss talked talk conversation fact facts line lines
    summary previous new like likes formerly""".split()
)
_WORDS = re.compile(r"[A-Za-z][A-Za-z'-]*|\d+")


def _stem(word: str) -> str:
    """A crude stem, enough to match "lives" with "live" and "working" with "work"."""
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word.rstrip("e")[:5]


def source_index(texts: list[str]) -> tuple[set[str], set[str]]:
    """The words of the summarised turns: exact (for names and numbers) and by a crude stem
    (so "enjoying" matches "enjoy")."""
    words = {w.lower() for text in texts for w in _WORDS.findall(text)}
    return words, {_stem(w) for w in words}


def sentences(summary: str) -> list[str]:
    """The summary's sentences that say something (two or more content words)."""
    found = []
    for match in _SENTENCES.finditer(summary):
        sentence = match.group().strip(" -*•\t")
        content = [w for w in _WORDS.findall(sentence) if w.lower() not in _STOP]
        if len(content) >= 2:
            found.append(sentence)
    return found


def grounded(sentence: str, source: tuple[set[str], set[str]]) -> bool:
    """Every name and number in the sentence occurs in the turns, and most of its content
    words do: what a summary of those turns may say."""
    exact, stems = source
    words = _WORDS.findall(sentence)
    content = [w for w in words if w.lower() not in _STOP]
    for i, word in enumerate(words):
        named = word[0].isupper() and i > 0 and word != "I"
        if (word.isdigit() or named) and word.lower() not in exact and word.lower() not in _STOP:
            return False
    hits = sum(_stem(w.lower()) in stems for w in content)
    return hits >= 0.5 * len(content)
