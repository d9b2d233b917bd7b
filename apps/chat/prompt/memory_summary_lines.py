"""Which sentences of a stored summary reach the prompt (memory.py): those the user's
statements do not contradict. A model's rewrite loses what the quotes keep: which value is out of
date, whose a detail is, and who said it.
"""

from __future__ import annotations

from collections.abc import Iterable

from apps.chat.prompt import memory_facts as facts
from apps.chat.prompt import memory_reading as reading
from apps.chat.prompt.memory_facts import Entry
from apps.chat.prompt.memory_summary import STOP, WORDS, sentences, stem


def summary_lines(summary: str, entries: list[Entry]) -> list[str]:
    """The stored summary's sentences that the statements do not contradict: none that names
    a value a later statement may have replaced or the user corrected or deleted on the page,
    none that names a detail the user gave only of something of theirs without "I" or "we"
    (_unsure_values: a sister's city told as the user's), and none that says what the user
    said only of another without naming that other (_tells_as_the_users: a neighbour's
    allergy told as the user's), and none that only repeats a replaced statement
    (_repeats_only)."""
    stale = _stale_words(entries)
    unsure = _unsure_values(entries)
    told = _told_of_others(entries)
    replaced, current = _said_stems(entries)
    kept = []
    for sentence in sentences(summary):
        # Read as the statements' details are ("2TB" one word, as _stale_words has it).
        words = {w.lower() for w in reading.WORD.findall(sentence)}
        if words & stale or {w.lower() for w in reading.detail_words(sentence)} & unsure:
            continue
        stems = _content_stems(sentence)
        if _repeats_only(stems, replaced, current) or _tells_as_the_users(stems, told):
            continue
        kept.append(sentence)
    return kept


def _content_stems(text: str) -> set[str]:
    return {stem(w.lower()) for w in WORDS.findall(text) if w.lower() not in STOP}


def _said_stems(entries: Iterable[Entry]) -> tuple[list[set[str]], list[set[str]]]:
    """The content stems of each statement a later one replaced, and of each other one."""
    replaced, current = [], []
    for e in entries:
        if e.value and e.kind in (facts.SAID, facts.TOOK):
            (replaced if e.later else current).append(_content_stems(e.value))
    return replaced, current


def _repeats_only(stems: set[str], replaced: list[set[str]], current: list[set[str]]) -> bool:
    """Whether a summary sentence only repeats a statement a later one replaced: all its
    content words are that statement's, and no statement still current says them all ("also
    learning japanese." copied after "switched to korean.": a name written in lower case is no
    name to _stale_words)."""
    return (
        len(stems) >= 2
        and any(stems <= said for said in replaced)
        and not any(stems <= said for said in current)
    )


def _told_of_others(entries: Iterable[Entry]) -> list[tuple[set[str], set[str]]]:
    """What the user said only of someone or something of theirs ("My neighbour is allergic
    to sesame"): for each clause that opens with "my X" or "our X" (not "she chews my
    shoes": the pup is what that speaks of), the stem of X, which says whose it is, and the
    clause's other content stems that no clause in the user's own first person carries."""
    own: set[str] = set()
    theirs: list[tuple[set[str], set[str]]] = []
    said = [e.value for e in entries if e.value and e.kind == facts.SAID]
    for clause in (c for value in said for c in reading.clauses_of(value)):
        words = [w.lower() for w in reading.WORD.findall(clause.replace("\u2019", "'"))]
        if set(words) & reading.SUBJECT:
            own |= _content_stems(clause)
        elif set(words[:2]) & reading.POSSESSIVE:  # "my X" opens it: X is what it speaks of
            owners = {
                stem(words[at + 1].removesuffix("'s"))
                for at, word in enumerate(words[:-1])
                if word in reading.POSSESSIVE
            }
            theirs.append((owners, _content_stems(clause) - owners - reading.POSSESSIVE))
    return [(owners, content - own) for owners, content in theirs if content - own]


def _tells_as_the_users(stems: set[str], told: list[tuple[set[str], set[str]]]) -> bool:
    """Whether a summary sentence (its content stems) carries what the user said only of another
    without naming that other: "The user is allergic to sesame" from "My neighbour is allergic
    to sesame" (a rewrite that lost whose it is; "The user's neighbour is allergic..." names
    them)."""
    return any(stems & content and not stems & owners for owners, content in told)


def _unsure_values(entries: Iterable[Entry]) -> set[str]:
    """The names and numbers a summary may not tell as the user's: those the user said only
    in sentences that speak of something of theirs without saying "I" or "we" ("My sister
    lives in Porto", "My boss's cat is Nimbus": whose the detail is, the quote shows, a
    rewrite loses). A detail also said in a sentence of the user's own first person ("I
    live in Porto") is theirs; one said in no kept statement is a topic."""
    own, unsure = set(), set()
    for e in entries:
        if not e.value or e.kind != facts.SAID:
            continue
        words = reading.WORD.findall(e.value.replace("\u2019", "'"))
        lower = {w.lower() for w in words}
        details = {w.lower() for w in reading.detail_words_of(words)}
        if lower & reading.SUBJECT:
            own |= details
        elif lower & reading.POSSESSIVE:
            unsure |= details
    return unsure - own


def _stale_words(entries: Iterable[Entry]) -> set[str]:
    """Names and numbers of earlier statements that their later statement does not repeat:
    values that may be out of date (and every value the user replaced on the page)."""
    entries = list(entries)
    by_key = {e.key: e for e in entries}
    stale = set()
    for e in entries:
        if e.edited and e.former:
            stale.update(w.lower() for w in reading.detail_words(e.former) or [e.former])
        successor = by_key.get(e.later)
        if successor is not None:
            now = {w.lower() for w in reading.detail_words(successor.value)}
            stale.update(w.lower() for w in reading.detail_words(e.value) if w.lower() not in now)
    return stale
