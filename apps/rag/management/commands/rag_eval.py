"""`python manage.py rag_eval <corpus> <questions.jsonl>`: recall@k and MRR of retrieval.

Each line: {"question": "...", "document": "<source, or title>"}; "source", "title" or
"document_id" work too. A question counts as found when a passage of its document is among the
top k; its reciprocal rank is 1 / the position of that document among the documents retrieved.

With --calibrate it also sets the corpus's relevance gate (apps.rag.relevance): the least
cosine similarity a passage needs to reach the model, measured from these questions and
off-topic ones (built in, or --off-topic FILE with one question a line).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.rag import caches, relevance, retrieval
from apps.rag.models import Corpus, Document
from apps.rag.services import corpus_set_relevance_floor


class Command(BaseCommand):
    help = "Print recall@k and MRR of hybrid retrieval for a JSON Lines file of questions."

    def add_arguments(self, parser):
        parser.add_argument("corpus")
        parser.add_argument("questions", help="JSON Lines: question + document (source/title)")
        parser.add_argument("--k", type=int, default=5)
        parser.add_argument("--fusion", choices=["weighted", "rrf"], default=None)
        parser.add_argument("--verbose", action="store_true", help="print every miss")
        parser.add_argument(
            "--calibrate",
            action="store_true",
            help="set the corpus's relevance gate from these questions",
        )
        parser.add_argument(
            "--off-topic",
            default=None,
            help="off-topic questions for --calibrate, one a line "
            "(default: a built-in list of general questions)",
        )

    def handle(self, *args, corpus: str, questions: str, k: int, **options):
        try:
            target = Corpus.objects.get(name=corpus)
        except Corpus.DoesNotExist:
            raise CommandError(f"no such corpus: {corpus}") from None
        path = Path(questions)
        if not path.is_file():
            raise CommandError(f"no such file: {questions}")
        documents = list(Document.objects.filter(corpus=target).values("id", "source", "title"))
        lookup = {}
        for d in documents:
            lookup[str(d["id"])] = lookup[d["source"]] = lookup[d["title"].lower()] = d["id"]
        depth = max(k, 20)
        off_topic = None
        if options["off_topic"]:
            off_path = Path(options["off_topic"])
            if not off_path.is_file():
                raise CommandError(f"no such file: {options['off_topic']}")
            off_topic = [q.strip() for q in off_path.read_text("utf-8").splitlines() if q.strip()]
        answered: list[tuple[str, int]] = []
        found = 0
        reciprocal = 0.0
        asked = 0
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                question = record["question"]
                wanted = str(
                    record.get("document_id")
                    or record.get("document")
                    or record.get("source")
                    or record.get("title")
                )
            except (json.JSONDecodeError, KeyError, TypeError):
                self.stderr.write(f"line {number}: needs question and document; skipped")
                continue
            document_id = lookup.get(wanted) or lookup.get(wanted.lower())
            if document_id is None:
                self.stderr.write(f"line {number}: no document {wanted!r} in {corpus}; skipped")
                continue
            asked += 1
            answered.append((question, document_id))
            passages = retrieval.search(
                corpora=[target],
                query=question,
                embedding=caches.query_embedding(question, model=target.embedding_model),
                k=depth,
                fusion=options["fusion"],
                min_similarity=-1.0,
            )
            ranked = list(dict.fromkeys(p.document_id for p in passages))
            top_k = {p.document_id for p in passages[:k]}
            if document_id in top_k:
                found += 1
            if document_id in ranked:
                reciprocal += 1 / (ranked.index(document_id) + 1)
            elif options["verbose"]:
                self.stdout.write(f"  miss: {question}")
            if options["verbose"] and document_id not in top_k and document_id in ranked:
                self.stdout.write(f"  below top {k}: {question}")
        if not asked:
            raise CommandError("no usable question in the file")
        self.stdout.write(
            f"rag_eval: recall@{k} {found / asked:.3f}, MRR {reciprocal / asked:.3f} "
            f"over {asked} questions ({corpus})"
        )
        if options["calibrate"]:
            calibration = relevance.corpus_calibrate(
                corpus=target, questions=answered, off_topic=off_topic
            )
            corpus_set_relevance_floor(corpus=target, floor=calibration.floor)
            self.stdout.write(calibration.line(corpus))
