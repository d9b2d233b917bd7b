"""What the user told Sluice, kept in the user's own words.

No list of attributes, phrasings, jobs or relations decides what is a fact: a user turn is
read sentence by sentence, each kept verbatim (a *statement*, kind SAID) when it is:

- a statement: whatever the user asserts, not what they say to the assistant ("Tell me
  about..."); the first person (closed-class words of the grammar, not phrasings), a name or a
  number weigh more ("The ferry back to Tartu was late again" implies where the user lives);
- a question in the first person ("near my office in Leeds?"), of a generic person ("someone
  with a pacemaker"), or naming something.

A statement about someone in the user's life ("My sister lives in Porto") is kept as it was
said, in quotes: the quote itself says whose detail it is, so it is never told as the
user's. A short reply that takes the assistant's suggestion ("Perfect, going with that one.")
is kept with the suggestion it answers (kind TOOK).

A newer statement that speaks of the same thing as an older one (the embedding model's cosine
similarity of their closest clauses, MiniLM, already loaded for retrieval: memory_replaced.py)
marks the older one `later`: the prompt shows it as earlier, never as current. Nothing is
deleted on a guess; order and source are shown instead.

Entries the user corrected or deleted on the page (`edited`) win over the turns before the edit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

from apps.chat.prompt import memory_proposals
from apps.chat.prompt import memory_reading as reading
from apps.chat.prompt import memory_replaced as replaced

# USER and OTHER are kinds of entries stored by earlier releases (a subject and a value): they
# are still read, shown and edited as they were.
USER, OTHER, SAID, TOOK = "user", "other", "said", "took"
# What a model that writes memory chose of one turn (memory_writer.py): never shown itself; it
# stands in for this module's reading of that turn in merge().
NOTED = "noted"

# What being shown as earlier costs a statement's weight (memory.py fills the block by weight).
EARLIER_WEIGHT_COST = 1.0
# The assistant's turns whose proposals a later statement may take by name: a choice is
# sometimes made after a question or two about the options.
PROPOSALS_READ = 2
# The assistant's turns whose lists a later statement may choose from by a word that tells one
# option from the rest: a choice is made after questions about the options, answered at length.
OPTION_LISTS_READ = 5
# The turns before those merged that merge() reads (of `before`) for the assistant's proposals.
CONTEXT_TURNS = 2 * max(PROPOSALS_READ, OPTION_LISTS_READ)
# A reply that took a suggestion weighs 1 plus this per name or number of the proposal (up to
# two) when it says which option it takes, or FOLLOWED_WEIGHT_PER_NAME when it only follows a
# list (a list of steps or tips is answered by "lol ok." as often as options are by a choice).
TOOK_WEIGHT_PER_NAME = 1.5
FOLLOWED_WEIGHT_PER_NAME = 0.25
# Starts a line a later one may replace (the block's heading says so): short, as half the lines
# carry it, and the block's room is what loses facts.
EARLIER_MARK = "Earlier: "
# Statements a conversation keeps at most (the least telling leave first).
ENTRIES_KEPT = 160


@dataclass
class Entry:
    key: str  # "said:<hash>", "took:<hash>" (older releases: "city", "other:…")
    template: str  # "{}" standing for the value
    value: str  # the user's words; "" when the user deleted it (kept, so turns do not repeat it)
    kind: str = SAID
    former: str = ""  # an older release's replaced value, or the value an edit replaced
    at: int = 0  # the message that said it (for an edit: the newest message at the time)
    edited: bool = False  # set by the user on the page
    context: str = ""  # TOOK: the assistant's suggestion the reply answers
    later: str = ""  # the key of a newer statement that speaks of the same thing

    def text(self) -> str:
        """The entry as the prompt and the page show it."""
        if not self.value:
            return ""
        if self.edited:
            return f'"{self.value}" (as the user corrected it)'
        if self.kind == TOOK:
            # The suggestion's own double quotes made single: one pair of quotes per speaker.
            said = self.context.replace('"', "'").replace("\u201c", "'").replace("\u201d", "'")
            took = f'You suggested: "{said}"; the user replied: "{self.value}"'
            return f"{EARLIER_MARK}{took}" if self.later else took
        if self.kind in (USER, OTHER):
            sentence = self.template.replace("{}", self.value, 1)
            if self.former and self.former.lower() != self.value.lower():
                sentence = f"{sentence.rstrip('.')} (formerly {self.former})."
            return sentence
        if self.later:
            return f'{EARLIER_MARK}"{self.value}"'
        return f'"{self.value}"'

    @classmethod
    def from_dict(cls, data: dict) -> Entry | None:
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None


def entries_from_json(raw: Iterable) -> list[Entry]:
    return [e for d in raw or () if isinstance(d, dict) and (e := Entry.from_dict(d))]


def entries_to_json(entries: Iterable[Entry]) -> list[dict]:
    return [asdict(e) for e in entries]


def _key(kind: str, text: str) -> str:
    return f"{kind}:" + hashlib.sha1(" ".join(text.lower().split()).encode()).hexdigest()[:12]


def statements_of(text: str, *, at: int) -> list[tuple[Entry, float]]:
    """The statements one user turn (message `at`) yields, in the order said, each with its
    weight."""
    found = []
    for raw in reading.sentences_of(text):
        sentence = reading.read_sentence(raw)
        if sentence.kept:
            quoted = reading.shortened(sentence)
            found.append((Entry(_key(SAID, quoted), "{}", quoted, SAID, at=at), sentence.weight))
    return found


def reply_to_suggestion(
    text: str,
    previous_assistant: str,
    *,
    at: int,
    earlier: Sequence[str] = (),
    named: Mapping[str, frozenset[str]] | None = None,
    heard: Mapping[str, frozenset[str]] | None = None,
    answer: str = "",
) -> Entry | None:
    """The turn's reply that takes what the assistant proposed, kept with the proposal
    (memory_proposals.suggestion_taken), or None. `earlier`: the assistant's turns before the
    last, newest first (OPTION_LISTS_READ - 1 of them; names are read in PROPOSALS_READ - 1)."""
    taken = memory_proposals.suggestion_taken(
        text,
        previous_assistant,
        earlier[: PROPOSALS_READ - 1],
        named,
        lists=earlier,
        heard=heard,
        answer=answer,
    )
    if taken is None:
        return None
    reply, proposal = taken
    return Entry(_key(TOOK, reply + proposal), "{}", reply, TOOK, at=at, context=proposal)


# -- the same subject ---------------------------------------------------------------------------


def _mark_replaced(entries: list[Entry], newest: list[Entry]) -> None:
    """Each of `newest` marks as earlier the older statements of another turn (or replies that
    took a suggestion) that it replaces (memory_replaced.replaced_by)."""
    older = [e for e in entries if e.kind in (SAID, TOOK) and e.value and not e.edited]
    asking = [e.kind == SAID and not reading.asserts(e.value) for e in newest]
    for old, new in replaced.replaced_by(older, newest, asking):
        older[old].later = newest[new].key


def _mark_naming_replaced(entries: list[Entry]) -> None:
    """An older line that names what a later statement replaced (a name or number of the
    replaced statement that the later one does not repeat: "9 days" in a suggestion the user
    took, after "actually it's 12 days") is shown as earlier too: it speaks of the old value."""
    by_key = {e.key: e for e in entries}
    # Each line's names and numbers, read once: every prompt build runs this over the block.
    shown = {
        e.key: {w.lower() for w in reading.detail_words(_shown_words(e))}
        for e in entries
        if e.value
    }
    for old in entries:
        successor = by_key.get(old.later)
        if successor is None or old.key not in shown or successor.key not in shown:
            continue
        gone = {w.lower() for w in reading.detail_words(old.value)} - shown[successor.key]
        if not gone:
            continue
        for other in entries:
            if (
                other.at < successor.at
                and not other.later
                and not other.edited
                and other.kind in (SAID, TOOK)
                and other.key != successor.key
                and gone & shown.get(other.key, set())
            ):
                other.later = successor.key


def _shown_words(entry: Entry) -> str:
    """What a line shows: a reply that took a suggestion shows the suggestion too."""
    return f"{entry.context} {entry.value}" if entry.kind == TOOK else entry.value


# -- keeping them ---------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _statements_cached(text: str, at: int) -> tuple[tuple[Entry, float], ...]:
    return tuple(statements_of(text, at=at))


def statements_forget() -> None:
    """Empties the caches of statements and proposals read (bench/memory.py: a cold prompt)."""
    _statements_cached.cache_clear()
    memory_proposals.proposals_forget()
    replaced.replaced_forget()


def noted_read(noted: list[Entry], at: int) -> list[tuple[Entry, float]]:
    """A turn's statements as the model noted them (memory_writer.py): each quote a statement,
    the first with the option it took, if any."""
    found = []
    for entry in noted:
        if not entry.value:
            continue
        if entry.context:
            took = Entry(_key(TOOK, entry.value + entry.context), "{}", entry.value, TOOK)
            took.at, took.context = at, entry.context
            found.append((took, weight_of(took)))
        else:
            said = Entry(_key(SAID, entry.value), "{}", entry.value, SAID, at=at)
            found.append((said, weight_of(said)))
    return found


def merge(
    entries: list[Entry],
    turns: Iterable,
    *,
    newer: Callable[[int, int], bool],
    before: Sequence = (),
) -> list[Entry]:
    """`entries` (oldest first) updated by `turns` (oldest first; user and assistant turns):
    the user's statements are added, each marking an older one on the same subject as earlier;
    a reply to a suggestion is added with the suggestion. `newer(turn_id, message_id)`: whether
    the turn comes after that message; an entry the user edited or deleted holds against the
    turns before the edit, so they do not bring it back. NOTED entries among `entries` are what
    a model chose of a turn: that turn's statements are theirs instead of this module's reading;
    the result holds no NOTED entries. `before`: the turns just before `turns` (oldest first),
    read only for what the assistant proposed: a reply may take a proposal made before the
    turns being merged (a summary folds a conversation in parts)."""
    noted: dict[int, list[Entry]] = {}
    for entry in entries:
        if entry.kind == NOTED:
            noted.setdefault(entry.at, []).append(entry)
    merged = [replace(e) for e in entries if e.kind != NOTED]
    present = {e.key for e in merged}
    edits = [e for e in merged if e.edited]
    weights = {e.key: 1.0 for e in merged}
    previous_assistant = ""
    proposals: list[str] = []  # the assistant's turns before the last, newest first
    read = [(turn, False) for turn in list(before)[-CONTEXT_TURNS:]]
    read += [(turn, True) for turn in turns]
    # A name the user said before the assistant did is theirs, not a proposal.
    read_ids = {turn.id for turn, _ in read}
    earlier = [e.value for e in merged if e.kind == SAID and e.at not in read_ids]
    named_before = memory_proposals.names_before(earlier, [turn for turn, _ in read])
    heard = memory_proposals.heard_before(earlier, [turn for turn, _ in read])
    for index, (turn, merging) in enumerate(read):
        if turn.role != USER:
            previous_assistant = turn.text
            continue
        if not merging:
            if previous_assistant:
                proposals = [previous_assistant, *proposals][: OPTION_LISTS_READ - 1]
            previous_assistant = ""
            continue
        if turn.id in noted:
            said = noted_read(noted[turn.id], turn.id)
        else:
            took = reply_to_suggestion(
                turn.text,
                previous_assistant,
                at=turn.id,
                earlier=proposals,
                named=named_before,
                heard=heard,
                answer=_answer_to(read, index),
            )
            said = [(took, weight_of(took))] if took else []
            said += [
                (replace(e), w)
                for e, w in _statements_cached(turn.text, turn.id)
                if not took or e.value != took.value  # the reply is kept once, with its proposal
            ]
        if previous_assistant:
            proposals = [previous_assistant, *proposals][: OPTION_LISTS_READ - 1]
        previous_assistant = ""
        fresh = []
        for entry, weight in said:
            if entry.key in present:
                # Said again: kept once, unless the user edited it since and says it anew.
                edit = next((e for e in edits if e.key == entry.key), None)
                if edit is None or not newer(turn.id, edit.at):
                    continue
                merged.remove(edit)
                edits.remove(edit)
            present.add(entry.key)
            weights[entry.key] = weight
            fresh.append(entry)
        _mark_replaced(merged, fresh)
        merged.extend(fresh)
    _mark_naming_replaced(merged)
    return _bounded(merged, weights)


def _answer_to(read: Sequence[tuple], index: int) -> str:
    """The assistant's turn right after the user's turn read[index], or "" (none yet)."""
    following = read[index + 1][0] if index + 1 < len(read) else None
    return following.text if following is not None and following.role != USER else ""


def _bounded(entries: list[Entry], weights: dict[str, float]) -> list[Entry]:
    """At most ENTRIES_KEPT: edits always, then the most telling, in their order."""
    if len(entries) <= ENTRIES_KEPT:
        return entries
    ranked = sorted(entries, key=lambda e: (not e.edited, -weights.get(e.key, 1.0)))
    keep = {e.key for e in ranked[:ENTRIES_KEPT]}
    return [e for e in entries if e.key in keep]


def weight_of(entry: Entry) -> float:
    """How much an entry is worth in a full memory block: what it tells, less for an earlier
    statement that a later one may replace."""
    if entry.edited:
        return 100.0
    if entry.kind == TOOK:
        # As telling as the proposal it takes when the reply says which; a reply that only
        # follows a list ("lol ok.", "how do you fix a puncture.") may have taken nothing.
        named = min(reading.details(reading.WORD.findall(entry.context)), 2)
        says_which = memory_proposals.points_at(entry.value, entry.context)
        weight = 1.0 + (TOOK_WEIGHT_PER_NAME if says_which else FOLLOWED_WEIGHT_PER_NAME) * named
        return weight - EARLIER_WEIGHT_COST if entry.later else weight
    if entry.kind in (USER, OTHER):
        return 5.0
    weight = reading.read_sentence(entry.value).weight
    return weight - EARLIER_WEIGHT_COST if entry.later else weight


def entry_edit(entries: list[Entry], *, key: str, value: str, at: int) -> Entry | None:
    """The user's own correction of entry `key` ("" deletes it), None for a key not among
    `entries`. It holds against every turn said before message `at`."""
    current = next((e for e in entries if e.key == key), None)
    if current is None:
        return None
    value = " ".join(value.split())[:200]
    # The replaced value is kept, so that no summary sentence repeats it (memory_summary.py).
    former = current.value if current.value.lower() != value.lower() else current.former
    return Entry(key, current.template, value, current.kind, former, at, True, current.context)
