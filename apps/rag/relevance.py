"""Calibrating a corpus's relevance gate: the least cosine similarity a passage needs to be
given to the model.

A fixed floor fits no corpus well: with MiniLM, a general question ("What is the capital of
France?") reaches ~0.15 against documentation about a web service, while that corpus's own
questions reach 0.35 and more; another corpus sits elsewhere. So the floor is measured per
corpus from two sets of questions: the corpus's own (the file `rag_eval` reads, each naming the
document that answers it) and off-topic ones (a built-in list of general questions, or a file).
For each on-topic question the score is the best similarity of a passage of *its* document; for
each off-topic question, the best similarity of any passage. The floor is the threshold that
misclassifies the fewest of both, placed midway in the gap between them (ties keep the lower
floor: missing a relevant passage costs an answer, reading an irrelevant one costs a second).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from apps.rag import caches, retrieval
from apps.rag.models import Corpus

# Questions no operator's corpus is about: what the gate must turn away.
OFF_TOPIC_QUESTIONS = (
    "What is the capital of France?",
    "How do I bake sourdough bread?",
    "Who won the 2018 football world cup?",
    "What is the boiling point of water?",
    "Write a poem about the sea.",
    "How tall is Mount Everest?",
    "What is 17 times 23?",
    "Who wrote Pride and Prejudice?",
    "Translate 'good morning' into Spanish.",
    "What causes rainbows?",
    "Tell me a joke.",
    "How do vaccines work?",
    "What is the speed of light?",
    "Recommend a good science fiction novel.",
    "How many legs does a spider have?",
    "What is photosynthesis?",
    "Hi!",
    "Explain quantum entanglement simply.",
    "What's the weather like on Mars?",
    "How do I tie a tie?",
    # A conversation's follow-ups, retrieved for on their own words: they say nothing of the
    # corpus, and the turns before them are in the prompt already.
    "Tell me more.",
    "Can you give an example?",
    "What do you mean?",
    "Thanks, that helps.",
    "Could you explain that again more simply?",
    "Why?",
)

DEPTH = 20  # passages looked at per question


@dataclass
class Calibration:
    floor: float
    on_topic: list[float]
    off_topic: list[float]

    @property
    def kept(self) -> int:
        return sum(score >= self.floor for score in self.on_topic)

    @property
    def turned_away(self) -> int:
        return sum(score < self.floor for score in self.off_topic)

    def line(self, corpus: str) -> str:
        lowest = min(self.on_topic, default=float("nan"))
        highest = max(self.off_topic, default=float("nan"))
        return (
            f"relevance gate: floor {self.floor:.3f} ({corpus}); on-topic kept "
            f"{self.kept}/{len(self.on_topic)} (lowest {lowest:.3f}), off-topic turned away "
            f"{self.turned_away}/{len(self.off_topic)} (highest {highest:.3f})"
        )


def best_similarity(*, corpus: Corpus, question: str, document_id: int | None = None) -> float:
    """The best cosine similarity of a passage of `corpus` (of `document_id` when given) among
    the top DEPTH of the ungated ranking; 0 when none."""
    passages = retrieval.search(
        corpora=[corpus],
        query=question,
        embedding=caches.query_embedding(question, model=corpus.embedding_model),
        k=DEPTH,
        min_similarity=-1.0,
    )
    scores = [p.vector_score for p in passages if document_id in (None, p.document_id)]
    return max(scores, default=0.0)


def choose_floor(on_topic: list[float], off_topic: list[float]) -> float:
    """The threshold between the two sets of scores with the fewest on-topic scores below it
    plus off-topic scores at or above it, midway between neighbouring scores."""
    if not on_topic:
        raise ValueError("calibration needs on-topic questions")
    values = sorted(set(on_topic) | set(off_topic))
    # Below every score, between each neighbouring pair, above every score.
    thresholds = [values[0] - 1e-6]
    thresholds += [(a + b) / 2 for a, b in itertools.pairwise(values)]
    thresholds.append(values[-1] + 1e-6)

    def errors(t: float) -> int:
        return sum(s < t for s in on_topic) + sum(s >= t for s in off_topic)

    return round(min(thresholds, key=lambda t: (errors(t), t)), 4)


def corpus_calibrate(
    *, corpus: Corpus, questions: list[tuple[str, int]], off_topic: list[str] | None = None
) -> Calibration:
    """Measures and returns the floor for `corpus`; `questions`: (question, id of the document
    that answers it). Stores nothing (see services.corpus_set_relevance_floor)."""
    off_topic = list(OFF_TOPIC_QUESTIONS if off_topic is None else off_topic)
    on_scores = [
        best_similarity(corpus=corpus, question=q, document_id=document_id)
        for q, document_id in questions
    ]
    off_scores = [best_similarity(corpus=corpus, question=q) for q in off_topic]
    return Calibration(choose_floor(on_scores, off_scores), on_scores, off_scores)
