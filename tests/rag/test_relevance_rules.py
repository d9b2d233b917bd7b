"""Rules that keep the passages a prompt gets worth reading: no passage that is only a heading,
a heading match that counts the passage's own section (not its document's title), a relevance
gate that admits a question by its best passage, and an exact search the service is held to."""

from __future__ import annotations

import pytest

from apps.rag import caches, retrieval
from apps.rag.chunking import HEADING_SEPARATOR, chunk_text, sections
from apps.rag.models import Corpus


def test_a_heading_alone_joins_the_section_after_it():
    text = "# Guide\n\n## Install\n\nRun it.\n\n## Upgrade\n\nRun it again.\n"
    found = sections(text)
    assert [s.heading for s in found] == [
        f"Guide{HEADING_SEPARATOR}Install",
        f"Guide{HEADING_SEPARATOR}Upgrade",
    ]
    assert found[0].start == 0  # the title's words still lie in a chunk
    chunks = chunk_text(text, size=64, overlap=8)
    assert [c.text.splitlines()[0] for c in chunks] == ["# Guide", "## Upgrade"]
    assert all(len(c.text.splitlines()) > 1 for c in chunks)  # none is a heading alone


def test_a_heading_alone_at_the_end_or_before_a_page_break_is_kept():
    text = "Intro.\n\n# Appendix\n\f\nPage two.\n\n# Last"
    found = sections(text)
    bodies = [text[s.start : s.end].strip() for s in found]
    assert bodies == ["Intro.", "# Appendix", "Page two.", "# Last"]


def _scored(vector: float) -> retrieval._Scored:
    return retrieval._Scored({}, vector, vector, 0.0, 0.0, 1, None)


def test_a_calibrated_gate_admits_the_question_then_passages_near_the_floor():
    corpus = Corpus(relevance_floor=0.4)
    margin = retrieval.RELEVANCE_MARGIN
    # The question's best passage reaches the floor: passages within the margin come along.
    assert retrieval.relevant(_scored(0.45), corpus, None, best=0.45)
    assert retrieval.relevant(_scored(0.4 - margin + 0.01), corpus, None, best=0.45)
    assert not retrieval.relevant(_scored(0.4 - margin - 0.01), corpus, None, best=0.45)
    # Its best passage is below the floor: the question gets nothing at all.
    assert not retrieval.relevant(_scored(0.39), corpus, None, best=0.39)
    # The evaluation's override still shows the whole ranking.
    assert retrieval.relevant(_scored(0.0), corpus, -1.0, best=0.0)


def test_the_heading_match_counts_the_passages_own_section(handbook):
    query = "vacation"
    embedding = caches.query_embedding(query)
    passages = retrieval.search(
        corpora=[handbook], query=query, embedding=embedding, k=20, min_similarity=-1.0
    )
    by_heading = {p.heading: p.metadata_score for p in passages}
    assert by_heading["Vacation policy"] == 1.0  # the document's own introduction
    # The title's word is in every heading path of the document; it lifts none of them.
    assert by_heading[f"Vacation policy{HEADING_SEPARATOR}Carrying days over"] == 0.0


@pytest.mark.parametrize(
    "query", ["How many vacation days per year?", "FLAG_BILLING_V2", "coffee machine error"]
)
def test_exact_search_agrees_with_the_service_on_a_small_corpus(handbook, query):
    embedding = caches.query_embedding(query)
    options = {"corpora": [handbook], "query": query, "embedding": embedding, "k": 5}
    options["min_similarity"] = -1.0
    served = [p.chunk_id for p in retrieval.search(**options)]
    exact = [p.chunk_id for p in retrieval.search(**options, exact=True)]
    assert served == exact
