"""The relevance gate calibrated on the demo corpus (docs/, as `make run` ingests it), the
retrieval budget, and which sources an answer shows."""

from __future__ import annotations

import json
import uuid

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from apps.rag import caches, retrieval
from apps.rag.models import Corpus, Document
from apps.rag.prompting import citations_from, citations_used, passage_tokens, passages_within
from apps.rag.relevance import choose_floor
from apps.rag.services import corpus_ingest_paths, retrieve_for_prompt
from core.redis_client import get_redis
from tests.conftest import BASE_DIR

QUESTIONS = BASE_DIR / "bench" / "sluice_docs_questions.jsonl"


@pytest.fixture(scope="module")
def demo_corpus(django_db_setup, django_db_blocker, embedding_model) -> Corpus:
    """Ingested and calibrated once for the module: embedding all of docs/ takes a minute or
    two, and no test here changes the corpus. It is committed outside the tests' transactions,
    so it is deleted at the end, with the Redis keys it wrote under its own prefix."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    try:
        with django_db_blocker.unblock(), override_settings(SLUICE_REDIS_PREFIX=prefix):
            corpus = Corpus.objects.create(name="sluice-docs", access=Corpus.Access.EVERYONE)
            report = corpus_ingest_paths(corpus=corpus, paths=[str(BASE_DIR / "docs")])
            assert not report.failed, report.lines()
            call_command("rag_eval", "sluice-docs", str(QUESTIONS), "--calibrate")
            corpus.refresh_from_db()
        yield corpus
    finally:
        # Also when the build failed halfway: no other module may find its passages.
        with django_db_blocker.unblock():
            Corpus.objects.filter(name="sluice-docs").delete()
        client = get_redis()
        stale = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if stale:
            client.delete(*stale)


@pytest.mark.parametrize(
    "question",
    ["What is the capital of France?", "Who wrote Pride and Prejudice?", "How do I tie a tie?"],
)
def test_an_off_topic_question_retrieves_nothing_from_the_demo_corpus(demo_corpus, user, question):
    assert demo_corpus.relevance_floor is not None
    assert retrieve_for_prompt(user=user, query=question) == []


def test_on_topic_questions_still_retrieve_their_documents(demo_corpus, user):
    records = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    gated = ungated = 0
    for record in records:
        question = record["question"]
        passages = retrieve_for_prompt(user=user, query=question)
        assert passages, question  # the gate turns no on-topic question away
        document = Document.objects.get(corpus=demo_corpus, source__endswith=record["document"])
        gated += document.pk in {p.document_id for p in passages}
        # The same budget without the gate: the ranking alone (docs/ changes as it is written).
        everything = retrieval.search(
            corpora=[demo_corpus],
            query=question,
            k=4,
            embedding=caches.query_embedding(question),
            min_similarity=-1.0,
        )
        within = passages_within(everything, budget_tokens=settings.RAG_PROMPT_TOKENS)
        ungated += document.pk in {p.document_id for p in within}
    # The gate keeps what answers: the right document is there as often as without it.
    assert gated >= ungated - 1 and gated >= len(records) // 2


def test_without_calibration_the_default_floor_applies(make_corpus, user):
    corpus = make_corpus("sluice-faq", paths=[BASE_DIR / "docs" / "faq.md"])
    assert corpus.relevance_floor is None
    passages = retrieve_for_prompt(user=user, query="Which model answers when there is no GPU?")
    # From this corpus (the module's calibrated demo corpus may be there too).
    faq = set(Document.objects.filter(corpus=corpus).values_list("pk", flat=True))
    assert faq & {p.document_id for p in passages}


def test_the_floor_separates_the_two_sets_midway():
    assert choose_floor([0.4, 0.5, 0.6], [0.1, 0.2]) == pytest.approx(0.3)
    # Overlapping sets: the threshold with the fewest mistakes (one off-topic let through).
    assert choose_floor([0.3, 0.5, 0.6], [0.1, 0.35, 0.2]) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        choose_floor([], [0.1])


def test_passages_are_cut_to_the_budget(demo_corpus, user):
    question = "What happens when a worker dies in the middle of a request?"
    whole = retrieve_for_prompt(user=user, query=question, budget_tokens=10_000)
    cut = retrieve_for_prompt(user=user, query=question, budget_tokens=300)
    assert len(whole) > 1
    assert sum(passage_tokens(p.text) for p in cut) <= 300
    assert [p.chunk_id for p in cut] == [p.chunk_id for p in whole[: len(cut)]]
    first = passage_tokens(whole[0].text)
    trimmed = passages_within(whole, budget_tokens=first + 60)
    assert trimmed[-1].text.endswith("…") and trimmed[-1].text != whole[1].text
    assert passages_within(whole, budget_tokens=first + 10) == whole[:1]


def test_sources_are_the_passages_the_answer_uses(demo_corpus, user):
    question = "Can I use a Redis Cluster?"
    passages = retrieve_for_prompt(user=user, query=question, budget_tokens=10_000)
    citations = citations_from(passages, question=question)
    assert len(citations) >= 2
    # Cited by number: exactly those.
    assert citations_used(citations, "Yes [2].") == [citations[1]]
    # No number: the passages whose words the answer repeats.
    borrowed = " ".join(citations[0]["terms"][:6])
    used = citations_used(citations, f"Sluice says: {borrowed}.")
    assert citations[0] in used
    # An answer that uses none of them shows no sources.
    assert citations_used(citations, "Paris is the capital of France.") == []
    # The question's own words prove nothing: every answer repeats them.
    assert "cluster" not in citations[0]["terms"]


def test_the_stored_answer_keeps_only_the_sources_it_used():
    from apps.chat.recorder import answer_message
    from contract.protocol import Answer, State

    citations = [
        {"number": 1, "title": "Redis", "terms": ["cluster", "slots", "sharded"]},
        {"number": 2, "title": "Backups", "terms": ["backup", "pg_dump", "restore"]},
    ]
    answer = Answer(
        id="r1", user_id="1", conversation_id="5", state=State.DONE, text="Use a Redis Cluster [1]."
    )
    assert [c["number"] for c in answer_message(answer, citations).citations] == [1]
    answer.text = "Paris."
    assert answer_message(answer, citations).citations == []
