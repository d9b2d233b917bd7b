"""Relevance of retrieval on hand-labelled questions about Sluice's own documentation.

The corpus is `docs/` ingested through the real pipeline, as `make run` ingests it, with its
relevance gate calibrated as `make run` calibrates it (`rag_eval --calibrate` on
bench/sluice_docs_questions.jsonl and the built-in off-topic questions).

The labelled set (bench/data/docs_questions.jsonl) holds questions written as users ask them,
each labelled with the document that answers it and a short phrase from the docs that the
answering passage must contain: a passage hits when it comes from that document and contains
the phrase (markup and line breaks aside), so the labels survive any change of chunking. Some
questions are answered in two places ("also"). Off-topic questions carry no label; those that
share a word with the corpus ("sluice gate") are what a relevance gate finds hardest.
About 30 % of the questions are marked `held`: kept out of every tuning decision, reported
apart, so a change that only fits the other 70 % shows. Together they are the dev set.

The independent set (bench/data/docs_questions_independent.jsonl, split `independent`: 80 on
topic, 20 off topic) was written by someone who never saw the retrieval rules, and is frozen:
it is the headline, since no rule was fitted to its wording.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
QUESTIONS = BASE_DIR / "bench" / "data" / "docs_questions.jsonl"
INDEPENDENT = BASE_DIR / "bench" / "data" / "docs_questions_independent.jsonl"
CALIBRATION_QUESTIONS = BASE_DIR / "bench" / "sluice_docs_questions.jsonl"
CORPUS = "sluice-docs"
DEPTH = 10  # passages ranked per question for hit@5 and MRR@10


def normal(text: str) -> str:
    return " ".join(re.sub(r"[`*]", "", text).split()).lower()


@dataclass
class Question:
    text: str
    split: str
    labels: list[tuple[str, str]] = field(default_factory=list)  # (document source, phrase)
    shares: str = ""  # off-topic: the word it shares with the corpus

    @property
    def off_topic(self) -> bool:
        return not self.labels

    def hits(self, passage, sources: dict[int, str]) -> bool:
        source, text = sources.get(passage.document_id), normal(passage.text)
        return any(source == doc and phrase in text for doc, phrase in self.labels)


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        labels = []
        if not row.get("off_topic"):
            labels.append((row["document"], normal(row["answer"])))
            labels += [(a["document"], normal(a["answer"])) for a in row.get("also", [])]
        question = Question(row["question"], row.get("split", "dev"), labels)
        question.shares = row.get("shares", "")
        out.append(question)
    return out


def ingest_docs():
    """The demo corpus, re-ingested (forced: the chunking under test may have changed) and
    calibrated as `make run` does."""
    from apps.rag import caches, relevance
    from apps.rag.ingestion import Ingestor
    from apps.rag.models import Corpus, Document
    from apps.rag.services import corpus_set_relevance_floor

    corpus, _ = Corpus.objects.get_or_create(name=CORPUS, defaults={"access": "everyone"})
    # The weights and fusion a new corpus gets, as `make run`'s is created with.
    defaults = ("vector_weight", "text_weight", "metadata_weight", "fusion")
    for name in defaults:
        setattr(corpus, name, Corpus._meta.get_field(name).get_default())
    corpus.save(update_fields=defaults)
    ingestor = Ingestor(corpus, force=True)
    paths = sorted((BASE_DIR / "docs").glob("*.md"))
    for path in paths:
        ingestor.add_bytes(source=f"docs/{path.name}", data=path.read_bytes())
    report = ingestor.finish()
    Document.objects.filter(corpus=corpus).exclude(
        source__in=[f"docs/{p.name}" for p in paths]
    ).delete()
    corpus.refresh_from_db()
    print(
        f"ingest: docs/ ({report.documents} documents) in {report.seconds:.1f}s through the "
        f"whole pipeline, {corpus.chunk_count} chunks "
        f"({report.chunks / max(report.seconds, 1e-9):.0f} chunks/s, embedding included)",
        flush=True,
    )
    ids = dict(Document.objects.filter(corpus=corpus).values_list("source", "id"))
    asked = []
    for line in CALIBRATION_QUESTIONS.read_text("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            asked.append((row["question"], ids[row["document"]]))
    caches.clear_local()
    calibration = relevance.corpus_calibrate(corpus=corpus, questions=asked)
    corpus_set_relevance_floor(corpus=corpus, floor=calibration.floor)
    print(calibration.line(CORPUS) + " (as make run calibrates it)", flush=True)
    corpus.refresh_from_db()
    return corpus


@dataclass
class Scores:
    hit5: list[float] = field(default_factory=list)
    rr: list[float] = field(default_factory=list)

    def add(self, ranked: list[bool]) -> None:
        self.hit5.append(float(any(ranked[:5])))
        first = next((i for i, hit in enumerate(ranked[:DEPTH], start=1) if hit), None)
        self.rr.append(1.0 / first if first else 0.0)

    @property
    def hit_at_5(self) -> float:
        return statistics.mean(self.hit5) if self.hit5 else float("nan")

    @property
    def mrr(self) -> float:
        return statistics.mean(self.rr) if self.rr else float("nan")


ARMS = ("vector", "text", "weighted", "rrf", "service")


def rankings(corpus, question: str, embedding) -> dict[str, list]:
    """Each arm's ungated top DEPTH passages: vector only, full text only (passages with no
    word of the question are not in that list), hybrid by weights, by RRF, and the corpus's own
    setting (what the service runs)."""
    from apps.rag import retrieval
    from apps.rag.retrieval import Weights

    def run(**options):
        # The fusion arms compare first stages; only the service runs the reranker (if any).
        options.setdefault("rerank", False)
        options.update(corpora=[corpus], query=question, embedding=embedding, k=DEPTH)
        return retrieval.search(min_similarity=-1.0, **options)

    weights = Weights.of(corpus)
    return {
        "vector": run(fusion="weighted", weights=Weights(1.0, 0.0, 0.0)),
        "text": [
            p for p in run(fusion="weighted", weights=Weights(0.0, 1.0, 0.0)) if p.text_score > 0
        ],
        "weighted": run(fusion="weighted", weights=weights),
        "rrf": run(fusion="rrf", weights=weights),
        "service": run(rerank=True),
    }


@dataclass
class Result:
    scores: dict[tuple[str, str], Scores]  # (arm, split) -> scores; split "all" too
    cited: dict[str, list[float]]  # split -> answering passage among those the prompt got
    cited_count: list[int]
    off_shared: list[float]  # shared-word off-topic questions given passages
    off_plain: list[float]
    misses: list[str]
    prompt_seconds: list[float] = field(default_factory=list)  # retrieve_for_prompt, on topic
    given: list[tuple[Question, list]] = field(default_factory=list)  # the passages cited
    sources: dict[int, str] = field(default_factory=dict)  # document id -> source

    def arm(self, name: str, split: str = "all") -> Scores:
        return self.scores[(name, split)]


def evaluate(corpus, path: Path = QUESTIONS, *, verbose: bool = False) -> Result:
    from django.contrib.auth import get_user_model

    from apps.rag import caches
    from apps.rag.models import Document
    from apps.rag.services import retrieve_for_prompt

    user, _ = get_user_model().objects.get_or_create(username="bench-rag")
    sources = dict(Document.objects.filter(corpus=corpus).values_list("id", "source"))
    questions = load_questions(path)
    # A label the docs no longer hold (they were edited) can never hit: said, not hidden.
    contents = {
        source: normal(content)
        for source, content in Document.objects.filter(corpus=corpus).values_list(
            "source", "content"
        )
    }
    stale = [
        (doc, phrase)
        for q in questions
        for doc, phrase in q.labels
        if phrase not in contents.get(doc, "")
    ]
    if stale:
        print(f"labels ({path.name}): {len(stale)} answer phrases not in docs/: {stale[:5]}")
    scores: dict[tuple[str, str], Scores] = {}
    cited: dict[str, list[float]] = {"all": []}
    result = Result(scores, cited, [], [], [], [], sources=sources)
    started = time.perf_counter()
    for q in questions:
        if q.off_topic:
            given = retrieve_for_prompt(user=user, query=q.text, corpora=[corpus.pk])
            result.given.append((q, given))
            (result.off_shared if q.shares else result.off_plain).append(float(bool(given)))
            if verbose and given:
                print(f"  off-topic given {len(given)}: {q.text} -> {given[0].title}")
            continue
        embedding = caches.query_embedding(q.text)
        # Asked first: its time is a new question's (the arms below reuse a second stage's
        # scores of the same passages).
        asked = time.perf_counter()
        given = retrieve_for_prompt(user=user, query=q.text, corpora=[corpus.pk])
        result.prompt_seconds.append(time.perf_counter() - asked)
        result.given.append((q, given))
        for arm, ranked in rankings(corpus, q.text, embedding).items():
            hits = [q.hits(p, sources) for p in ranked]
            for split in ("all", q.split):
                scores.setdefault((arm, split), Scores()).add(hits)
        hit = any(q.hits(p, sources) for p in given)
        result.cited_count.append(len(given))
        for split in ("all", q.split):
            cited.setdefault(split, []).append(float(hit))
        if not hit:
            result.misses.append(q.text)
            if verbose:
                titles = "; ".join(p.title for p in given) or "(none)"
                print(f"  not cited: {q.text} [{q.labels[0][0]}] -> {titles}")
    seconds = time.perf_counter() - started
    print(f"relevance: {len(questions)} questions of {path.name} in {seconds:.0f}s", flush=True)
    return result


def pct(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.0f} %" if values else "n/a"


def splits(result: Result) -> list[str]:
    """The splits to print: all, then the set's own when it has more than one."""
    own = sorted(s for s in result.cited if s != "all")
    return ["all", *own] if len(own) > 1 else ["all"]


def report(result: Result, name: str) -> str:
    """Prints the per-arm table; returns the line that goes before the bench's last line."""
    for split in splits(result):
        n = len(result.arm("service", split).hit5)
        parts = [
            f"{arm} {result.arm(arm, split).hit_at_5:.3f}/{result.arm(arm, split).mrr:.3f}"
            for arm in ARMS
        ]
        print(
            f"relevance ({name} set, {split}, {n} questions), hit@5/mrr@{DEPTH}: "
            + ", ".join(parts)
        )
    from django.conf import settings

    mean_given = statistics.mean(result.cited_count) if result.cited_count else 0
    seconds = sorted(result.prompt_seconds) or [0.0]
    second_stage = (
        f"reranked by {Path(settings.RAG_RERANK_MODEL).name} over the first "
        f"{settings.RAG_RERANK_CANDIDATES}"
        if settings.RAG_RERANK_MODEL
        else "no second stage"
    )
    print(
        f"prompt retrieval ({second_stage}): p50 {1000 * statistics.median(seconds):.0f} ms, "
        f"max {1000 * seconds[-1]:.0f} ms per question (query embedding cached)"
    )
    by_split = ", ".join(f"{s} {pct(result.cited[s])}" for s in splits(result)[1:])
    return (
        f"rag relevance ({name} set): answering passage among those cited "
        f"{pct(result.cited['all'])} ({by_split + '; ' if by_split else ''}"
        f"{mean_given:.1f} passages cited on average); off-topic given passages: sharing a "
        f"word {pct(result.off_shared)} of {len(result.off_shared)}, others "
        f"{pct(result.off_plain)} of {len(result.off_plain)}"
    )


def headline(result: Result) -> str:
    """The set's figures for the bench's last line: the service's hit@5 and MRR, the answer
    among the passages cited, and how often the gate gives nothing / something wrongly."""
    service = result.arm("service")
    none = sum(1 for n in result.cited_count if n == 0)
    shared, plain = sum(result.off_shared), sum(result.off_plain)
    return (
        f"hit@5 {service.hit_at_5:.3f}, mrr {service.mrr:.3f}, cited {pct(result.cited['all'])}, "
        f"on-topic given none {none} of {len(result.cited_count)}, off-topic given passages: "
        f"sharing a word {shared:.0f} of {len(result.off_shared)}, others {plain:.0f} of "
        f"{len(result.off_plain)}"
    )


def diagnose(result: Result, top: int = 8) -> None:
    """Which passages the prompt got: for each off-topic question given any; on-topic
    questions citing several passages of one document; the passages cited most often, and for
    how many of those questions they held no answer."""

    def name(p) -> str:
        return f"{result.sources.get(p.document_id, '?')} '{p.heading}' (chunk {p.chunk_id})"

    off_given = [(q, given) for q, given in result.given if q.off_topic and given]
    print(f"  off-topic questions given passages: {len(off_given)}")
    for q, given in off_given:
        shared = f" [shares {q.shares!r}]" if q.shares else ""
        print(f"    {q.text}{shared} -> " + "; ".join(name(p) for p in given))
    on_topic = [given for q, given in result.given if not q.off_topic]
    several = sum(1 for given in on_topic if len({p.document_id for p in given}) < len(given))
    print(
        f"  on-topic questions citing several passages of one document: {several} of "
        f"{len(on_topic)} ({sum(1 for given in on_topic if len(given) > 1)} cite two or more)"
    )
    cited: dict[str, list[bool]] = {}
    for q, given in result.given:
        for p in given:
            cited.setdefault(name(p), []).append(q.hits(p, result.sources))
    ranked = sorted(cited.items(), key=lambda item: -len(item[1]))
    print(f"  passages cited: {len(cited)} distinct; most often (questions, of which unanswered):")
    for passage, hits in ranked[:top]:
        print(f"    {len(hits):3d} ({hits.count(False):3d}) {passage}")
