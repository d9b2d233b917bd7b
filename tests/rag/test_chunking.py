"""Chunking properties: no text lost, overlap as configured, sizes bounded, sections kept."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.rag.chunking import HEADING_SEPARATOR, chunk_text, sections
from apps.rag.embeddings import get_tokenizer
from apps.rag.extraction import normalize

WORDS = st.sampled_from(
    "the worker pulls requests from Redis when it has free slots; admission queues "
    "everything else fairly. Embedding-models read 256 word-pieces, so chunks stay below "
    "that. Überprüfung naïve café 東京 supercalifragilisticexpialidocious x=1+2 (see §3)".split()
)
LINE = st.lists(WORDS, min_size=0, max_size=30).map(" ".join)
HEADING = st.builds(lambda level, title: "#" * level + " " + title, st.integers(1, 3), LINE)
BLOCK = st.one_of(LINE, LINE, LINE, HEADING, st.just(""), st.just("```"), st.just("\f"))
DOCUMENT = st.lists(BLOCK, min_size=1, max_size=40).map("\n".join)
ANY_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=600
)
SIZES = st.integers(min_value=16, max_value=120).flatmap(
    lambda size: st.tuples(st.just(size), st.integers(min_value=0, max_value=size // 2 - 1))
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def covered(text: str, chunks) -> set[int]:
    spans = set()
    for c in chunks:
        assert text[c.char_start : c.char_end] == c.text  # a chunk is a verbatim slice
        spans.update(range(c.char_start, c.char_end))
    return spans


@FAST
@given(text=DOCUMENT, sizes=SIZES)
def test_no_text_is_lost(text, sizes):
    size, overlap = sizes
    text = normalize(text)
    chunks = chunk_text(text, size=size, overlap=overlap)
    spans = covered(text, chunks)
    lost = [i for i, ch in enumerate(text) if not ch.isspace() and i not in spans]
    assert not lost, [text[i] for i in lost]


@FAST
@given(text=ANY_TEXT, sizes=SIZES)
def test_no_text_is_lost_whatever_the_characters(text, sizes):
    size, overlap = sizes
    text = normalize(text)
    spans = covered(text, chunk_text(text, size=size, overlap=overlap))
    assert all(ch.isspace() or i in spans for i, ch in enumerate(text))


@FAST
@given(text=DOCUMENT, sizes=SIZES)
def test_sizes_are_bounded(text, sizes):
    size, overlap = sizes
    chunks = chunk_text(normalize(text), size=size, overlap=overlap)
    tokenizer = get_tokenizer()
    for c in chunks:
        assert 1 <= c.token_count <= size
        # What the model reads of the stored text is no longer than the count says.
        assert len(tokenizer.encode(c.text, add_special_tokens=False).ids) <= size


@FAST
@given(text=DOCUMENT, sizes=SIZES)
def test_overlap_is_as_configured(text, sizes):
    size, overlap = sizes
    chunks = chunk_text(normalize(text), size=size, overlap=overlap)
    for before, after in itertools.pairwise(chunks):
        if before.section != after.section:
            assert after.token_start == 0  # a new section starts fresh
            continue
        shared = before.token_end - after.token_start
        # Exactly `overlap` tokens, moved back to the start of a word cut by it.
        assert shared >= overlap
        assert after.token_start < before.token_end or overlap == 0
        assert after.token_start > before.token_start  # always progress


def test_long_prose_uses_the_whole_budget_and_breaks_at_paragraphs():
    paragraph = "The dispatcher admits requests in fair order and tells users their position. "
    text = "\n\n".join(paragraph * 3 for _ in range(20))
    chunks = chunk_text(text, size=200, overlap=40)
    assert len(chunks) > 3
    for c in chunks[:-1]:
        assert c.token_count >= 100  # at least half full
        assert c.text.endswith("position.")  # ends at a paragraph or sentence end


def test_sections_follow_headings_and_pages():
    text = "# Guide\n\nIntro.\n\n## Install\n\nRun it.\n\n```\n# not a heading\n```\f\nPage two."
    found = sections(text)
    assert [s.heading for s in found] == [
        "Guide",
        f"Guide{HEADING_SEPARATOR}Install",
        f"Guide{HEADING_SEPARATOR}Install",
    ]
    assert [s.page for s in found] == [1, 1, 2]
    chunks = chunk_text(text, size=64, overlap=8)
    assert any("# not a heading" in c.text for c in chunks)  # code fences are not headings


@pytest.mark.parametrize(("size", "overlap"), [(4, 0), (100, 50), (100, -1)])
def test_nonsense_sizes_are_refused(size, overlap):
    with pytest.raises(ValueError):
        chunk_text("some text", size=size, overlap=overlap)
