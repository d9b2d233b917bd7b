"""The cross-encoder stage's plumbing. No installed package ships a trained cross-encoder, so
the model here is one the test builds: MiniLM's tokenizer in front of a tiny BERT with random
weights. Its scores mean nothing; what is tested is that the configured model scores each
passage, that its scores decide the order, and that the stage stays off when none is set.
The stage's quality is measured by bench/rag.py where a trained model is at hand."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from apps.rag import rerank
from apps.rag.embeddings import model_path
from apps.rag.services import retrieve_for_prompt

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
    expected = model.predict(
        [(QUERY, f"{p.heading}\n{p.text}" if p.heading else p.text) for p in passages]
    )
    assert [p.rerank_score for p in passages] == pytest.approx([float(s) for s in expected])
    scores = [p.rerank_score for p in passages]
    assert scores == sorted(scores, reverse=True)
    assert [p.number for p in passages] == list(range(1, len(passages) + 1))


def test_a_missing_model_folder_fails_loudly(handbook, user, settings, tmp_path):
    settings.RAG_RERANK_MODEL = str(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="RAG_RERANK_MODEL"):
        retrieve_for_prompt(user=user, query=QUERY)
