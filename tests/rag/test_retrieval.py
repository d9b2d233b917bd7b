"""Hybrid ranking on the small handbook corpus, through the service the chat calls."""

from __future__ import annotations

import pytest

from apps.rag import caches, retrieval
from apps.rag.models import Corpus
from apps.rag.services import retrieve_for_prompt
from tests.rag.conftest import FIXTURES


@pytest.mark.parametrize(
    ("query", "passage"),
    [
        ("How many days of paid vacation do I get?", "Vacation policy"),
        ("can I keep unused holidays for next year", "Vacation policy > Carrying days over"),
        ("the coffee machine shows error E42", "The office coffee machine > When it shows E42"),
        ("how do I undo a bad billing release", "Deploying the billing service > Rolling back"),
        ("Where do the bird watchers meet?", "Birds"),
        ("I lost my visitor badge", "Security badges > Lost badges"),
    ],
)
def test_questions_find_the_right_passage(handbook, user, query, passage):
    passages = retrieve_for_prompt(user=user, query=query)
    document = passage.split(" > ")[0]
    # The best passage comes from the right document, and the passage that answers is near the
    # top (a document's introduction and the section that answers often score alike).
    assert passages[0].title.startswith(document)
    assert passage in [p.title for p in passages[:2]]


def test_passages_are_numbered_with_component_scores_and_source_links(handbook, user):
    passages = retrieve_for_prompt(user=user, query="How do I roll back billing?", k=3)
    assert [p.number for p in passages] == [1, 2, 3][: len(passages)]
    first = passages[0]
    assert first.source_url == f"/rag/chunks/{first.chunk_id}/"
    assert 0 < first.vector_score <= 1
    assert first.text_score == 1.0  # the best full-text match among the candidates
    assert first.metadata_score == 1.0  # "roll back" is in its section heading
    assert first.score == pytest.approx(
        0.7 * first.vector_score + 0.07 * first.text_score + 0.03 * first.metadata_score, abs=1e-5
    )
    assert "harbor rollback billing" in first.text
    assert "rollback" in first.snippet.lower()


def test_an_exact_identifier_is_found_through_full_text(handbook, user):
    passages = retrieve_for_prompt(user=user, query="FLAG_BILLING_V2", k=2)
    assert "FLAG_BILLING_V2" in passages[0].text
    assert passages[0].text_rank == 1


def test_weights_change_the_ranking(handbook):
    embedding = caches.query_embedding("release")
    # Full text alone: only passages containing "release" can score.
    text_only = retrieval.search(
        corpora=[handbook],
        query="release",
        embedding=embedding,
        k=5,
        weights=retrieval.Weights(0, 1, 0),
        min_similarity=-1,
    )
    assert all("release" in p.text.lower() for p in text_only if p.score > 0)
    assert text_only[0].text_score == 1.0


def test_reciprocal_rank_fusion_is_an_option(handbook, user):
    Corpus.objects.filter(pk=handbook.pk).update(fusion=Corpus.Fusion.RRF)
    passages = retrieve_for_prompt(user=user, query="How many vacation days per year?", k=3)
    assert passages[0].title.startswith("Vacation policy")
    best = passages[0]
    expected = 0.7 / (60 + best.vector_rank) + 0.07 / (60 + best.text_rank) + 0.03 / 61
    assert best.score == pytest.approx(expected, rel=1e-4)


def test_metadata_filter_and_boost(make_corpus, user, tmp_path):
    lines = [
        '{"id": "en", "title": "Opening hours", "text": "The library opens at nine.",'
        ' "metadata": {"lang": "en"}}',
        '{"id": "de", "title": "Öffnungszeiten", "text": "Die Bibliothek öffnet um neun.",'
        ' "metadata": {"lang": "de"}}',
    ]
    (tmp_path / "hours.jsonl").write_text("\n".join(lines))
    make_corpus("library", paths=[tmp_path / "hours.jsonl"])
    query = "When does the library open?"
    only_de = retrieve_for_prompt(user=user, query=query, metadata_filter={"lang": "de"})
    assert [p.metadata["lang"] for p in only_de] == ["de"]
    boosted = retrieve_for_prompt(user=user, query=query, boost={"lang": "de"}, k=2)
    plain = retrieve_for_prompt(user=user, query=query, k=2)
    de_score = {p.title: p.score for p in boosted}["Öffnungszeiten"]
    assert de_score > {p.title: p.score for p in plain}["Öffnungszeiten"]


def test_small_talk_retrieves_nothing(handbook, user):
    assert retrieve_for_prompt(user=user, query="hi!") == []
    assert retrieve_for_prompt(user=user, query="   ") == []


def test_only_the_named_corpora_are_searched(handbook, make_corpus, user):
    other = make_corpus("birds", paths=[FIXTURES / "handbook" / "birds.txt"])
    passages = retrieve_for_prompt(user=user, query="bird club", corpora=["birds"])
    assert passages and {p.corpus_id for p in passages} == {other.pk}
    only_handbook = retrieve_for_prompt(user=user, query="bird club", corpora=[handbook.pk])
    assert {p.corpus_id for p in only_handbook} == {handbook.pk}
