"""The second stage, the service's or a corpus's own. No installed package ships a trained
cross-encoder, so the cross-encoder here is one the test builds: MiniLM's tokenizer in front of
a tiny BERT with random weights. Its scores mean nothing; what is tested is that the configured
model scores each passage, that its scores decide the order (among a corpus's own places when
corpora differ in reranker), and that the stage stays off when none is set. The language-model
scorer runs the demo's real SmolLM2 GGUF, so its tests check what it decides too. The stage's
quality on the labelled questions is measured by `bench/rag.py --rerank-model`."""

from __future__ import annotations

import math

import pytest
import torch
from django.core.exceptions import ValidationError
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from apps.rag import rerank
from apps.rag.embeddings import model_path
from apps.rag.services import retrieve_for_prompt
from tests.rag.conftest import FIXTURES
from worker.prepare_model import bundled_gguf

QUERY = "How do I roll back billing?"


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path()))
    torch.manual_seed(7)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_without_a_model_the_first_stage_order_stands(handbook, user, settings):
    settings.RAG_RERANK_MODEL = ""
    passages = retrieve_for_prompt(user=user, query=QUERY, budget_tokens=10_000)
    assert len(passages) >= 3
    assert all(p.rerank_score is None for p in passages)
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)


def test_the_configured_model_scores_and_orders_the_passages(
    handbook, user, settings, cross_encoder_dir
):
    settings.RAG_RERANK_MODEL = ""
    retrieve_for_prompt(user=user, query=QUERY, budget_tokens=10_000)  # cached, unranked
    settings.RAG_RERANK_MODEL = cross_encoder_dir
    settings.RAG_RERANK_CANDIDATES = 20
    # Asked again at once: the cached first-stage result is not what comes back (every
    # passage carries the model's score below).
    passages = retrieve_for_prompt(user=user, query=QUERY, budget_tokens=10_000)
    model = rerank.get_reranker(cross_encoder_dir)
    expected = model.score(
        QUERY, [f"{p.heading}\n{p.text}" if p.heading else p.text for p in passages]
    )
    assert [p.rerank_score for p in passages] == pytest.approx(expected)
    scores = [p.rerank_score for p in passages]
    assert scores == sorted(scores, reverse=True)
    assert [p.number for p in passages] == list(range(1, len(passages) + 1))


def test_a_missing_model_folder_fails_loudly(handbook, user, settings, tmp_path):
    settings.RAG_RERANK_MODEL = str(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="RAG_RERANK_MODEL"):
        retrieve_for_prompt(user=user, query=QUERY)


ANSWERS = "To roll back a billing change, open Billing > History and press Undo on the change."
UNRELATED = "Bananas are rich in potassium and grow best in warm, humid climates."


@pytest.fixture(scope="module")
def language_model():
    return rerank.get_reranker(str(bundled_gguf()))


def test_the_language_model_scores_the_answering_passage_above_an_unrelated_one(language_model):
    answers, unrelated = language_model.score(QUERY, [ANSWERS, UNRELATED])
    assert answers > unrelated
    # The same pair asked again (the second retrieval of a question) scores the same.
    assert language_model.score(QUERY, [UNRELATED, ANSWERS]) == [unrelated, answers]


def test_a_pair_scores_the_same_after_other_pairs_as_on_a_fresh_model(language_model):
    """Between pairs only the instruction's tokens stay in the model's cache: what the previous
    passage and question left there must not leak into the next score."""
    from apps.rag.query_likelihood import QueryLikelihood

    question = "Which fruit grows best in humid climates?"
    [after_others] = language_model.score(question, [UNRELATED])  # after the tests above
    [fresh] = QueryLikelihood(str(bundled_gguf())).score(question, [UNRELATED])
    assert after_others == pytest.approx(fresh, rel=1e-3)


def test_a_passage_longer_than_the_models_context_is_cut_not_refused(language_model):
    long_passage = " ".join([ANSWERS] * 200)  # thousands of tokens; the context holds 512
    [score] = language_model.score(QUERY, [long_passage])
    assert math.isfinite(score) and score < 0


def test_the_language_model_orders_the_passages_of_a_search(
    handbook, user, settings, language_model
):
    settings.RAG_RERANK_MODEL = str(bundled_gguf())
    settings.RAG_RERANK_CANDIDATES = 2
    passages = retrieve_for_prompt(user=user, query=QUERY, budget_tokens=10_000)
    assert len(passages) > 2
    head, rest = passages[:2], passages[2:]
    assert all(p.rerank_score is not None for p in head)
    assert head[0].rerank_score >= head[1].rerank_score
    assert all(p.rerank_score is None for p in rest)


def test_a_missing_gguf_file_fails_loudly(handbook, user, settings, tmp_path):
    settings.RAG_RERANK_MODEL = str(tmp_path / "absent.gguf")
    with pytest.raises(FileNotFoundError, match="RAG_RERANK_MODEL"):
        retrieve_for_prompt(user=user, query=QUERY)


def _set_reranker(corpus, value: str | None) -> None:
    corpus.rerank_model = value
    corpus.full_clean()
    corpus.save()


def test_a_corpus_reranks_its_passages_with_its_own_model(
    handbook, make_corpus, user, settings, cross_encoder_dir
):
    settings.RAG_RERANK_MODEL = ""
    settings.RAG_RERANK_CANDIDATES = 20
    copy = make_corpus("copy", paths=[FIXTURES / "handbook"])
    first = retrieve_for_prompt(user=user, query=QUERY, k=10, budget_tokens=10_000)
    assert {p.corpus_id for p in first} == {handbook.pk, copy.pk}
    _set_reranker(handbook, cross_encoder_dir)
    passages = retrieve_for_prompt(user=user, query=QUERY, k=10, budget_tokens=10_000)
    # The copy has no reranker: its passages keep their places and have no model score.
    places = lambda ps, c: [(i, p.chunk_id) for i, p in enumerate(ps) if p.corpus_id == c]  # noqa: E731
    assert places(passages, copy.pk) == places(first, copy.pk)
    assert all(p.rerank_score is None for p in passages if p.corpus_id == copy.pk)
    # The handbook's are scored by its model and ordered by it among the places they held.
    own = [p for p in passages if p.corpus_id == handbook.pk]
    expected = rerank.get_reranker(cross_encoder_dir).score(
        QUERY, [f"{p.heading}\n{p.text}" if p.heading else p.text for p in own]
    )
    assert [p.rerank_score for p in own] == pytest.approx(expected)
    assert [p.rerank_score for p in own] == sorted((p.rerank_score for p in own), reverse=True)
    assert {p.chunk_id for p in own} == {p.chunk_id for p in first if p.corpus_id == handbook.pk}


def test_a_corpus_may_turn_the_services_reranker_off(handbook, user, settings, cross_encoder_dir):
    settings.RAG_RERANK_MODEL = cross_encoder_dir
    assert all(p.rerank_score is not None for p in retrieve_for_prompt(user=user, query=QUERY))
    _set_reranker(handbook, "off")
    assert all(p.rerank_score is None for p in retrieve_for_prompt(user=user, query=QUERY))
    _set_reranker(handbook, None)  # empty: the service's again
    assert all(p.rerank_score is not None for p in retrieve_for_prompt(user=user, query=QUERY))


def test_a_reranker_this_machine_does_not_have_is_refused_when_set(handbook, tmp_path):
    for absent in (str(tmp_path / "absent"), str(tmp_path / "absent.gguf"), "fleet:"):
        with pytest.raises(ValidationError, match="No reranker"):
            _set_reranker(handbook, absent)
    _set_reranker(handbook, "fleet:bge-reranker-v2-m3")  # served by workers: named only
