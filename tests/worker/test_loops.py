"""The repeated n-gram detector that stops a looping answer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.loops import LoopDetector

PROSE = (
    "Rivers carry water from high ground to the sea. The Danube flows through ten countries, "
    "more than any other river in the world, and ends in a delta on the Black Sea coast. Its "
    "basin holds about eighty million people, and ships travel most of its length. "
)


def fed(text: str, *, piece: int = 3, **options) -> LoopDetector:
    detector = LoopDetector(**options)
    for i in range(0, len(text), piece):  # streamed in small pieces, words cut across them
        if detector.feed(text[i : i + piece]):
            break
    return detector


def test_a_phrase_repeated_back_to_back_is_a_loop():
    text = "To choose well, " + "how to decide " * 20
    detector = fed(text)
    assert detector.looping and detector.period == 3
    # Caught early: about the minimum span of words, not at the length cap.
    assert len(detector.words) < 45


def test_a_repeated_sentence_is_a_loop():
    sentence = "The answer depends on the size of the cluster and the load it carries. "
    assert fed("Well. " + sentence * 5).looping


def test_ordinary_prose_and_short_repetition_are_not():
    assert not fed(PROSE * 1).looping
    assert not fed("No, no, no, no. That is not how it works. " + PROSE).looping
    table = "| a | b | c |\n|---|---|---|\n| 1 | 2 | 3 |\n| 4 | 5 | 6 |\n"
    assert not fed(table + PROSE).looping


def test_a_loop_stays_reported_and_needs_no_more_text():
    detector = fed("yes " * 40)
    assert detector.looping
    assert detector.feed("something else entirely")


@given(
    st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"]), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=5),
)
def test_any_unit_repeated_long_enough_is_found(unit, piece):
    repeats = max(3, -(-30 // len(unit))) + 1
    text = "start " + " ".join(unit * repeats) + " "
    assert fed(text, piece=piece).looping


def tail_repeats(words: list[str], *, min_words=30, min_repeats=3, max_period=40) -> int:
    """The definition, checked the slow way: the smallest period whose unit, repeated enough
    times to span `min_words`, makes up the tail (0: none)."""
    for period in range(1, max_period + 1):
        span = period * max(min_repeats, -(-min_words // period))
        tail = words[len(words) - span :]
        if span <= len(words) and all(tail[i] == tail[i % period] for i in range(period, span)):
            return period
    return 0


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=120),
    st.integers(min_value=2, max_value=12),
    st.integers(min_value=2, max_value=4),
    st.integers(min_value=1, max_value=8),
)
def test_the_detector_stops_where_the_definition_first_holds(
    words, min_words, min_repeats, max_period
):
    options = dict(min_words=min_words, min_repeats=min_repeats, max_period=max_period)
    expected_at, expected_period = None, 0
    for n in range(1, len(words) + 1):
        expected_period = tail_repeats(words[:n], **options)
        if expected_period:
            expected_at = n
            break
    detector = fed(" ".join(words) + " ", **options)
    if expected_at is None:
        assert not detector.looping
    else:
        assert detector.looping
        assert (len(detector.words), detector.period) == (expected_at, expected_period)
