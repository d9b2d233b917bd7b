"""What the assistant proposed, and a user turn that takes it (memory_facts.py keeps such a
reply with the proposal): a list's options (their heads read by memory_reading.item_heads),
the names a proposal gives, what tells one option from the rest, and a reply that answers a
list, points back, names a place in a list, names an option of a recent list or repeats a
name."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from apps.chat.prompt.memory_reading import (
    ANAPHORS,
    CHOICE,
    CLAUSE_END,
    POSITIONS,
    WORD,
    detail_words,
    detail_words_of,
    details,
    item_heads,
    read_sentence,
    sentences_of,
    shortened,
    telling_words,
)

# A reply's opening this short that points back answers the assistant's turn before it (and a
# sentence that repeats one of its names, up to twice this long).
REPLY_MAX_WORDS = 14
# The assistant's suggestion kept with such a reply (characters).
SUGGESTION_CHARS = 200
_HIGHLIGHTED = re.compile(r"(?:\*\*|[\"\u201c`])([^*\"\u201d`\n]{1,40})(?:\*\*|[\"\u201d`])")


def _read_suggestion(assistant_text: str, heads: Sequence[str]) -> str:
    """What the assistant proposed: its list's item `heads`, numbered, when it wrote a list
    (an option taken by its place, "the second one", stays findable); else its sentences with
    a name, a number, a quoted or a highlighted word; else its first sentences; up to
    SUGGESTION_CHARS."""
    if len(heads) >= 2:
        listed = "; ".join(f"{n}. {head}" for n, head in enumerate(heads, 1))
        return listed[:SUGGESTION_CHARS]
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
    return " ".join(picked)


def _read_proposed_names(assistant_text: str, heads: Sequence[str]) -> set[str]:
    """What names what the assistant proposed: the names in a list's item heads (their first
    word too when it is the only name in the head) and every pair of words in a row in a head
    ("keepsake box"), highlighted or quoted words, and the names in its sentences (capitalised
    past a sentence's first word). Single words and pairs, lower-cased."""
    names = set()
    for head in heads:
        words = WORD.findall(head)
        capitalised = [w for w in words if w[0].isupper()]
        names.update(capitalised if len(capitalised) == 1 else capitalised[1:])
        names.update(f"{a} {b}" for a, b in itertools.pairwise(words))
    for quoted in _HIGHLIGHTED.findall(assistant_text):
        names.update(WORD.findall(quoted))
    for sentence in sentences_of(assistant_text):
        names.update(w for w in detail_words(sentence) if not w.isdigit())
    return {w.lower() for w in names if len(w) > 3}


# Assistant turns whose reading is kept: every prompt reads the conversation's turns again, so
# each turn is read once per process instead of once per question (reading them again took a
# third of the web's CPU in bench/overhead.py at 100 streams, by py-spy). Each entry holds the
# turn's text as its key: a few MB for turns of a few KB.
PROPOSALS_CACHED = 2048


@dataclass(frozen=True)
class Proposal:
    """What one assistant turn proposed: its list's item heads, the names it gives, and the
    suggestion a reply that takes it is kept with."""

    heads: tuple[str, ...]
    names: frozenset[str]
    suggestion: str


@lru_cache(maxsize=PROPOSALS_CACHED)
def proposal_of(assistant_text: str) -> Proposal:
    heads = tuple(item_heads(assistant_text))
    return Proposal(
        heads,
        frozenset(_read_proposed_names(assistant_text, heads)),
        _read_suggestion(assistant_text, heads),
    )


@lru_cache(maxsize=PROPOSALS_CACHED)
def _options_told_apart(assistant_text: str) -> tuple[frozenset[str], ...]:
    """Each option's head words that no other option of the list has: what tells it from the
    rest ("junior apprentice" among "second qualified baker" and "casual counter hand")."""
    heads = [telling_words(head) for head in proposal_of(assistant_text).heads]
    return tuple(
        words.difference(*(other for j, other in enumerate(heads) if j != i))
        for i, words in enumerate(heads)
    )


# "the <words> one" or "the one <words>": what the pro-form says of the option it takes.
_POINTED = re.compile(r"\bthe\s+((?:[^\s,.;:!?]+\s+){0,3}?)ones?\b([^,.;:!?]*)", re.IGNORECASE)


def _pointed_at(sentence: str) -> str:
    """The words a choice pro-form is described by: "the green-white one" (before it), "the
    one where you line up the mirror" (after it, to the clause's end); "" without one."""
    match = _POINTED.search(sentence)
    if not match:
        return ""
    return (match.group(1) or match.group(2)).strip()


def list_named(sentence: str, lists: Sequence[str], heard: Mapping[str, frozenset[str]]) -> str:
    """The newest of `lists` (assistant turns with options, newest first) one of whose options
    the sentence names by a word no other option of that list has and no turn had said before
    it (`heard`, from heard_before: a topic already talked of is no choice among the list's
    options): "apprentice it is" after a question about apprentices' wages answered with a
    list of costs; or ""."""
    said = telling_words(sentence)
    for text in lists:
        before = heard.get(text, frozenset())
        if any((said & words) - before for words in _options_told_apart(text)):
            return text
    return ""


def heard_before(said_earlier: Sequence[str], turns: Sequence) -> dict[str, frozenset[str]]:
    """Each assistant turn's text (of `turns`, oldest first) to the words (telling_words) said
    before it, by either side: `said_earlier` (the user's words before these turns), then the
    turns as they come."""
    # Each statement's words are read (and cached) alone: a joined text would be a new key
    # each time the conversation grows.
    heard = frozenset().union(*(telling_words(said) for said in said_earlier))
    before = {}
    for turn in turns:
        if turn.role != "user":
            before[turn.text] = heard
        heard = heard | telling_words(turn.text)
    return before


# The sentences of the assistant's answer read for the option it confirms ("Good call - Plan B,
# shower over bath, it is."): its opening, before whatever it goes on to explain or list.
CONFIRMING_SENTENCES = 2


@lru_cache(maxsize=PROPOSALS_CACHED)
def _written_as_names(head: str) -> frozenset[str]:
    """The head's words written as names: its names and numbers (detail_words_of), and words
    with a capital inside ("WBC", "Saint-Henri") even as its first, as telling_words reads them."""
    words = WORD.findall(head)
    inner_capital = [w for w in words if any(c.isupper() for c in w[1:])]
    return telling_words(" ".join([*detail_words_of(words), *inner_capital]))


def _names(said: str, option: frozenset[str], head: str, *, by_its_only_word: bool = True) -> bool:
    """`said` names the option told apart by `option`'s words (its `head`'s): by one of them
    written as a name, by its only one ("Rosemont"; unless not `by_its_only_word`), or by two
    telling words of the head in a row, one of them its own ("shower over bath"). Such words
    apart may be a chance ("choose it ... hive" beside "Choose a hive type")."""
    shared = telling_words(said) & option
    if shared & _written_as_names(head) or (shared and by_its_only_word and len(option) == 1):
        return True
    pairs = [telling_words(pair) for pair in _said_names(head) & _said_names(said) if " " in pair]
    return any(len(words) == 2 and words & option for words in pairs)


def confirmed_choice(
    statements: Sequence[str], questions: Sequence[str], answer: str, lists: Sequence[str]
) -> tuple[str, str] | None:
    """A choice the assistant's `answer` to the turn confirms: its opening names one option
    of the newest of `lists` (assistant turns with options, newest first) it names any of,
    and only one ("No problem - Saint-Henri is a great pick for you!" after "Gut, dann nehme
    ich das Viertel am Kanal."); an option of an older list named by its only telling word
    must be pointed at by the user's words too. The turn must state something (`statements`)
    and not ask about that option (`questions`: an answer to "is Saint-Henri safe?" names it
    without a choice). The statement kept is the one that shares most words with the answer's
    opening (how the user described it), else the first. Returns (statement, the list's text)."""
    if not statements or not answer:
        return None
    opening = " ".join(sentences_of(answer)[:CONFIRMING_SENTENCES])
    asked = telling_words(" ".join(questions))
    for age, text in enumerate(lists):
        told_apart = zip(_options_told_apart(text), proposal_of(text).heads, strict=True)
        named = [(words, head) for words, head in told_apart if _names(opening, words, head)]
        if not named:
            continue
        [(words, head), *others] = named
        if others or words & asked:
            return None
        if age and not _names(opening, words, head, by_its_only_word=False):
            # An older list: an option's only telling word in the answer's opening is as often
            # a chance ("it's cheap" beside "Use cheap proteins") as a choice, so the user's own
            # words must point at that option too, by a word of it or its place in the list.
            statements = [s for s in statements if _points_at_option(s, head)]
            if not statements:
                return None
        confirming = telling_words(opening)
        reply = max(statements, key=lambda s: len(telling_words(s) & confirming))
        return reply, text
    return None


def _points_at_option(statement: str, head: str) -> bool:
    """The statement names a word of the option's head or takes an option by its place."""
    its_words = telling_words(statement) & telling_words(head)
    return bool(its_words or _said_names(statement) & POSITIONS)


def proposals_forget() -> None:
    """Empties the caches of the assistant's turns read (bench/memory.py: a cold prompt)."""
    proposal_of.cache_clear()
    _options_told_apart.cache_clear()
    _written_as_names.cache_clear()


def _said_names(sentence: str) -> set[str]:
    """The sentence's words and pairs of words in a row, lower-cased (as a Proposal's names)."""
    words = [w.lower() for w in WORD.findall(sentence)]
    return {*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))}


def said_names(texts: Sequence[str]) -> frozenset[str]:
    """What the user has named in `texts` (their turns): a name the assistant repeats after
    them is no proposal of its own."""
    return frozenset(name for text in texts for name in _said_names(text))


def names_before(said_earlier: Sequence[str], turns: Sequence) -> dict[str, frozenset[str]]:
    """Each assistant turn's text (of `turns`, oldest first) to what the user had named before
    it: `said_earlier` (their words before these turns), then their turns as they come. A name
    they ask about after the assistant proposed it stays its proposal."""
    named = said_names(said_earlier)
    before = {}
    for turn in turns:
        if turn.role == "user":
            named = named | said_names([turn.text])
        else:
            before[turn.text] = named
    return before


def points_at(reply: str, proposal: str) -> bool:
    """The reply says which of the proposal it takes: it names something the proposal names,
    a place in it, or points back with a pro-form ("the middle one", "that one"). Pointing
    back with "that" or "it" says which only of a single suggestion: after a list of options
    ("That looks smashing.") it takes the whole answer, not one of them."""
    said = _said_names(reply)
    read = proposal_of(proposal)
    pointers = POSITIONS | CHOICE | (ANAPHORS if len(read.heads) < 2 else frozenset())
    return bool(said & pointers or said & read.names)


def _has_digit(text: str) -> bool:
    return any(character.isdigit() for character in text)


def _says_its_own(reply: str, proposal: str) -> bool:
    """The reply names something the proposal does not (a name or number of its own: "Ok
    update: we traded it in for a Suzuki Ertiga") and points at none of its options: it is a
    statement of its own, not an answer to the list."""
    own = {w.lower() for w in detail_words(reply)} - _said_names(proposal)
    return bool(own) and not points_at(reply, proposal)


def _lists(previous_assistant: str, earlier: Sequence[str]) -> list[str]:
    """The assistant's turns that gave a list of options, newest first."""
    return [a for a in [previous_assistant, *earlier] if a and len(proposal_of(a).heads) >= 2]


def suggestion_taken(
    text: str,
    previous_assistant: str,
    earlier: Sequence[str] = (),
    named_before: Mapping[str, frozenset[str]] | None = None,
    lists: Sequence[str] = (),
    heard: Mapping[str, frozenset[str]] | None = None,
    answer: str = "",
) -> tuple[str, str] | None:
    """A turn that takes what the assistant proposed: its opening, or a sentence that points
    with "the ... one", names an option of the turn before it or of one of the `lists` (the
    assistant's turns before that, newest first) by a word no other option of that list has
    (list_named; `heard`, from heard_before: the words said before each list); or the
    assistant's `answer` to the turn names one option of a list (confirmed_choice); or its
    opening is a short reply (not a question; its first clause, when the sentence goes on to
    give reasons) to a list of options the turn just before it gave, in any words until the
    assistant has answered (then it must point or name a place); or a short reply
    that points back at that turn and says nothing of its own ("Perfect, going with that
    one."); or one of its statements repeats a name that turn or one of the `earlier` assistant
    turns (newest first) proposed ("kittiwake it is", said after a question about the
    options); a name the user had said before that assistant turn (`named_before`, from
    names_before) is theirs, not proposed.
    That sentence is kept with the proposal, since a reply alone says nothing. Whatever else
    the turn says is read as usual; an acknowledgement ("Thank you.", "Ok.") after anything but
    a list takes nothing."""
    sentences = sentences_of(text)
    opening = next(iter(sentences), "")
    reply, taken = "", ""
    statements = [
        s
        for s in sentences
        if len(s.split()) <= REPLY_MAX_WORDS * 2 and not read_sentence(s).question
    ]
    listed = _lists(previous_assistant, lists or earlier)
    for statement in statements:
        # The opening, or a sentence that takes "the ... one": a choice named by a word that
        # tells one option from the rest, in whichever of the lists gave that option. A word
        # said before the list counts only beside the pro-form ("the design one"): alone, it
        # is the topic going on ("Negative, no asbestos.").
        pointed = _pointed_at(statement)
        if statement != opening and not pointed:
            continue
        if named := list_named(pointed or statement, listed, {} if pointed else heard or {}):
            reply, taken = statement, named
            break
    if not reply and (
        confirmed := confirmed_choice(
            statements,
            [s for s in sentences if read_sentence(s).question],
            answer,
            listed,
        )
    ):
        # The assistant's answer names the option the turn took, in whatever words it took it.
        reply, taken = confirmed
    words = opening.split()
    first_clause = next(iter(CLAUSE_END.split(opening)), "").split()
    if not reply and previous_assistant and words and not read_sentence(opening).question:
        said = {w.lower() for w in WORD.findall(opening.replace("\u2019", "'"))}
        short = len(words) <= REPLY_MAX_WORDS
        if (
            len(proposal_of(previous_assistant).heads) >= 2
            and len(first_clause) <= REPLY_MAX_WORDS
            and not _says_its_own(opening, previous_assistant)
            # Once the assistant has answered, a reply in none of the list's words, with no
            # place in it and not pointing back ("ok ordered it"), took an option only if
            # the answer names it (confirmed_choice): "changes every fortnight" after a list
            # of tips took nothing.
            and (
                not answer
                or said & ANAPHORS
                or points_at(opening, previous_assistant)
                or _has_digit(opening)
            )
        ):
            # A short reply to a list of options answers it, in whatever words or language
            # ("Option 3 for sure", "vamos con la segunda", "2\ufe0f\u20e3"): kept with the
            # options, so the reply and the list together say which was taken.
            reply, taken = shortened(read_sentence(opening)), previous_assistant
        elif short and said & ANAPHORS and not details(WORD.findall(opening)):
            # Pointing back and saying nothing of its own; "wait, it's July 27" is a statement.
            reply, taken = opening, previous_assistant
        elif (
            short
            and said & POSITIONS
            and not details(WORD.findall(opening))
            and (listed := _lists(previous_assistant, earlier))
        ):
            # A place in the newest list ("ok the third then"). Without a list, or beside a
            # name or a number of its own, "two" counts something ("so two 4TB drives").
            reply, taken = opening, listed[0]
    if not reply:
        for assistant in [previous_assistant, *earlier]:
            theirs = (named_before or {}).get(assistant, frozenset())
            names = proposal_of(assistant).names - theirs if assistant else set()
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
    proposal = proposal_of(taken).suggestion if taken else ""
    if not reply or not proposal:
        return None
    return " ".join(reply.split()), proposal
