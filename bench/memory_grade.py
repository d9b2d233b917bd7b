"""Grading for bench/memory.py: is a fact in a prompt with its current value, is a summary
sentence grounded in the turns it summarises, is what the user said of others kept as theirs;
and the report."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field

from memory_data import PLACEMENTS, Conversation, Fact, has

from apps.chat.prompt import memory_summary

ARMS = ("window", "summaries", "ceiling")

# A sentence that names an old value beside one of these words says it is no longer current.
_FORMER = re.compile(
    r"\b(formerly|previously|used to|no longer|not any ?more|old|former|moved from|"
    r"changed from|instead of|until|earlier)\b",
    re.IGNORECASE,
)
_SENTENCES = re.compile(r"[^.!?\n]+[.!?]?")
_EARLIER_LINE = re.compile(r"\s*(?:- )?Earlier\b")


def presents_old(fact: Fact, memory_block: str) -> bool:
    """The corrected fact's old value stated as current somewhere in the memory block (the
    summary and kept lines, which sit before the turns and carry no order of their own): a
    sentence naming it without a word that marks it as past. Not counted: a line marked as
    earlier as a whole (every sentence of it), and a sentence that names the current value
    too, which is the correction itself ("it's the 13th now, not the 12th"), nor one quoted from
    the correction's own turn ("Valencia had no more places!" before "So I will run Seville.")."""
    if not fact.old:
        return False
    for line in memory_block.splitlines():
        if _EARLIER_LINE.match(line):
            continue
        for match in _SENTENCES.finditer(line):
            sentence = match.group()
            if (
                has(fact.old, sentence)
                and not _FORMER.search(sentence)
                and not has(fact.value, sentence)
                and not _quoted_from(sentence, fact.corrected_in)
            ):
                return True
    return False


_QUOTE_EDGES = " \t-\"'\u201c\u201d"


def _quoted_from(sentence: str, turn: str) -> bool:
    """The sentence of a kept line is the user's words from `turn`: each of its parts, where
    the memory cut a long sentence to its clauses (joined by " \u2026 ")."""
    quote = sentence.removeprefix("- ").strip(_QUOTE_EDGES)
    if not turn or len(quote) < 8:
        return False
    parts = [part.strip(_QUOTE_EDGES) for part in quote.split("\u2026")]
    return all(part in turn for part in parts if part)


def kept(fact: Fact, memory_block: str, recent: str) -> bool:
    """The current value is in the prompt, and a corrected fact's old value is not presented
    as current. In the recent turns the old value may appear: the correction comes after it
    in the same turns, so their order says which holds."""
    if not (has(fact.value, memory_block) or has(fact.value, recent)):
        return False
    return not presents_old(fact, memory_block)


def only_as_earlier(fact: Fact, memory_block: str, recent: str) -> bool:
    """The fact's current value is in the prompt only in lines marked as earlier: kept, but the
    model is told it may be out of date (what marking too much costs)."""
    if has(fact.value, recent):
        return False
    lines = [line for line in memory_block.splitlines() if has(fact.value, line)]
    return bool(lines) and all(_EARLIER_LINE.match(line) for line in lines)


def answered(fact: Fact, answer: str) -> bool:
    return has(fact.value, answer) and not (fact.old and has(fact.old, answer))


def others_as_user(c: Conversation, lines: list[str]) -> list[tuple[str, str]]:
    """The lines of the memory block that name something the user said of another person
    other than inside a verbatim quote of the user's own words (a quote says whose it is),
    each with the user's turn that said it: (line, turn)."""
    said_by_user = [t.text for t in c.turns if t.role == "user"]
    found = []
    for line in lines:
        named = [v for v in c.others if has(v, line)]
        if not named:
            continue
        outside = _outside_user_quotes(line, said_by_user)
        if not any(has(v, outside) for v in named):
            continue
        said = next(
            (t.text for t in c.turns if t.role == "user" and any(has(v, t.text) for v in named)),
            "?",
        )
        found.append((line, said))
    return found


_QUOTED = re.compile(r'"([^"]+)"')


def _outside_user_quotes(line: str, said_by_user: list[str]) -> str:
    """The line less its quotes of the user's words, and, in a line that quotes them, less the
    other quotes too (the assistant's, in 'You suggested: "..."; the user replied: "..."').
    A quote runs from a quotation mark to any later one, so that the user's own quotation
    marks inside it ('Earlier: "Ingrid suggested "Olav"."') do not end it."""
    marks = [index for index, char in enumerate(line) if char == '"']
    quoted = [False] * len(line)
    for n, start in enumerate(marks):
        for end in marks[n + 1 :]:
            if line[start + 1 : end].strip() and _quotes_user(line[start + 1 : end], said_by_user):
                quoted[start : end + 1] = [True] * (end + 1 - start)
    if not any(quoted):
        return line
    outside = "".join(" " if inside else char for char, inside in zip(line, quoted, strict=True))
    return _QUOTED.sub(" ", outside)


def _quotes_user(quote: str, said_by_user: list[str]) -> bool:
    """The quote is the user's words: one turn holds it, or, for a long sentence the memory
    cut to its clauses (joined by " \u2026 "), each of its parts."""
    return any(all(part.strip() in text for part in quote.split("\u2026")) for text in said_by_user)


# The summary request's own words: a note that repeats them is instruction text, not memory.
_REQUEST_WORDS = f"{memory_summary.SUMMARY_SYSTEM} {memory_summary.SUMMARY_INSTRUCTIONS}"


def instruction_lines(memory_block: str) -> list[str]:
    """Sentences of the memory block that repeat most of the summary request's instruction."""
    request = {_stem(w.lower()) for w in _WORDS.findall(_REQUEST_WORDS) if w.lower() not in _STOP}
    found = []
    for sentence in sentences(memory_block):
        content = [_stem(w.lower()) for w in _WORDS.findall(sentence) if w.lower() not in _STOP]
        if len(content) >= 3 and sum(w in request for w in content) * 4 >= len(content) * 3:
            found.append(sentence)
    return found


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


# -- the report ------------------------------------------------------------------------------


@dataclass
class Tally:
    arms: tuple[str, ...] = ARMS
    instruction_lines: list[str] = field(default_factory=list)  # in the closing memory blocks
    stale_shown: list[str] = field(default_factory=list)  # old values shown as current
    dump: list | None = None  # the closing memory blocks, when asked for
    kept: Counter = field(default_factory=Counter)  # (arm, placement) → facts kept
    needed: Counter = field(default_factory=Counter)  # placement → facts asked
    carriers: Counter = field(default_factory=Counter)  # (arm, carrier) → facts carried
    old_current: Counter = field(default_factory=Counter)  # arm → old value shown as current
    hedged: Counter = field(default_factory=Counter)  # arm → current value only as earlier
    answered: Counter = field(default_factory=Counter)  # arm → right answers
    asked: Counter = field(default_factory=Counter)  # arm → questions asked
    perfect_sentences: int = 0  # the scripted summaries' sentences: the check's own error
    perfect_flagged: int = 0
    sentences: int = 0  # summary sentences the model wrote
    invented: int = 0  # of them, not grounded in the turns
    final_sentences: int = 0  # in the summaries that reached the closing prompts
    final_invented: int = 0
    others_as_user: Counter = field(default_factory=Counter)  # arm → lines that do so
    others_lines: int = 0  # what the user said of other people, kept as theirs
    words_lines: int = 0  # the user's words in the closing memory blocks (summaries arm)
    earlier_lines: int = 0  # of them, shown as earlier (a later line may replace them)
    prompt_ms: dict = field(default_factory=lambda: {"cold": [], "warm": []})  # closing prompt
    raw_sentences: int = 0  # summary sentences as the model wrote them
    summary_calls: int = 0
    summary_tokens: int = 0
    prompt_tokens: Counter = field(default_factory=Counter)  # arm → estimated tokens
    examples: list[str] = field(default_factory=list)
    others_shown: list[str] = field(default_factory=list)  # "arm: line <- the turn it is from"
    # (placement, why) → facts the summaries arm did not keep: "old shown" (as current), "left
    # out" (a statement holding the value was read, and the block's budget left it out) or
    # "not read" (none was).
    lost: Counter = field(default_factory=Counter)


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def report(tally: Tally, args, conversations: int, seconds: float, exchanges: int) -> str:
    total = sum(tally.needed.values())
    print(
        f"{conversations} conversations of {exchanges} exchanges, {total} facts "
        f"({total // len(PLACEMENTS)} per placement), budget {args.budget} tokens for turns "
        f"(context {args.context}, answer {args.answer_tokens}), {seconds:.0f}s"
    )
    print(
        f"  {'arm':10s} {'kept':>6s}   "
        + " ".join(f"{p:>9s}" for p in PLACEMENTS)
        + "   old value shown as current   prompt tokens"
    )
    for arm in tally.arms:
        kept = sum(tally.kept[arm, p] for p in PLACEMENTS)
        by = " ".join(f"{pct(tally.kept[arm, p], tally.needed[p]):8.0f}%" for p in PLACEMENTS)
        print(
            f"  {arm:10s} {pct(kept, total):5.1f}%   {by}   "
            f"{tally.old_current[arm]:>3d} of {tally.needed['corrected']} corrected facts"
            f"{'':10s}{tally.prompt_tokens[arm] / conversations:6.0f}"
        )
    for arm in [a for a in ("summaries", "ceiling") if a in tally.arms]:
        carried = ", ".join(
            f"{c} {pct(tally.carriers[arm, c], total):.0f} %"
            for c in ("summary", "key lines", "recent turns")
        )
        print(f"  {arm} carriers (a fact may be in several): {carried}")
    print(
        f"  summary sentences not grounded in the turns (invented): "
        f"{pct(tally.invented, tally.sentences):.0f} % of {tally.sentences} written by the "
        f"model; {tally.final_invented} of {tally.final_sentences} in the closing prompts"
    )
    print(
        f"    (the check flags {tally.perfect_flagged} of the scripted summaries' "
        f"{tally.perfect_sentences} sentences, all of them true)"
    )
    for example in tally.examples:
        print(f"    e.g. {example[:110]!r}")
    kept = tally.sentences
    print(
        f"  summary sentences the model wrote: {tally.raw_sentences}; kept by the grounding "
        f"check: {kept} ({pct(tally.raw_sentences - kept, tally.raw_sentences):.0f} % dropped)"
    )
    corrected = tally.needed["corrected"]
    print(
        f"  corrected facts with only the new value as current (summaries arm): "
        f"{tally.kept['summaries', 'corrected']} of {corrected}; facts in questions kept: "
        f"{pct(tally.kept['summaries', 'question'], tally.needed['question']):.0f} % of "
        f"{tally.needed['question']}"
    )
    print(
        "  lines presenting what the user said of others as the user's: "
        + ", ".join(f"{arm} {tally.others_as_user[arm]}" for arm in tally.arms[1:])
        + f"; statements about others kept as theirs: {tally.others_lines}"
    )
    if tally.others_shown:
        print("  others shown as the user's:")
    for shown in tally.others_shown[:20]:
        print(f"    {shown}")
    print(
        f"  {tally.summary_calls} summary requests, "
        f"{tally.summary_calls / conversations:.1f} per conversation, "
        f"{tally.summary_tokens} tokens"
    )
    answers = ", ".join(
        f"{arm} {pct(tally.answered[arm], tally.asked[arm]):.0f} % of {tally.asked[arm]}"
        for arm in args.answer_arms
    )
    print(f"  the demo model's answers (one question per sampled fact): {answers}")
    print(
        f"  instruction text in the closing memory blocks: {len(tally.instruction_lines)}; "
        f"old values shown as current: {len(tally.stale_shown)}"
    )
    for line in [*tally.instruction_lines, *tally.stale_shown][:10]:
        print(f"    {line[:200]!r}")
    lost = " ".join(
        f"{why} {sum(tally.lost[p, why] for p in PLACEMENTS)} "
        f"({'/'.join(str(tally.lost[p, why]) for p in PLACEMENTS)})"
        for why in ("left out", "not read", "old shown")
    )
    print(f"  facts not kept (summaries arm), by placement: {lost}")
    kept_facts = sum(tally.kept["summaries", p] for p in PLACEMENTS)
    # What hedging costs: a line shown as earlier that nothing replaced is still true, but
    # the model is told it may be out of date.
    print(
        f"  the user's words shown as earlier: {tally.earlier_lines} of {tally.words_lines} "
        "lines in the closing memory blocks; current values shown only as earlier: "
        f"{tally.hedged['summaries']} of {kept_facts} facts kept"
    )
    cold, warm = (statistics.median(tally.prompt_ms[c] or [0]) for c in ("cold", "warm"))
    print(
        f"  the closing prompt built in {warm:.1f} ms (median; statements embedded before), "
        f"{cold:.0f} ms cold (none embedded yet in the process)"
    )
    mine = [pct(tally.kept["summaries", p], tally.needed[p]) for p in PLACEMENTS]
    s, w = (pct(sum(tally.kept[a, p] for p in PLACEMENTS), total) for a in ("summaries", "window"))
    ceiling = ""
    if "ceiling" in tally.arms:
        c = pct(sum(tally.kept["ceiling", p] for p in PLACEMENTS), total)
        ceiling = f" (ceiling {c:.0f} %)"
    line = (
        f"facts kept {s:.0f} % with summaries vs {w:.0f} % sliding window{ceiling}; by "
        f"placement {'/'.join(f'{v:.0f}' for v in mine)} %; old value shown as current "
        f"{tally.old_current['summaries']} of {tally.needed['corrected']}; current values only "
        f"as earlier {tally.hedged['summaries']} of {kept_facts}; instruction text "
        f"{len(tally.instruction_lines)}, invented {tally.final_invented}, others as the "
        f"user's {tally.others_as_user['summaries']}"
    )
    print(f"memory: {line}")
    return line
