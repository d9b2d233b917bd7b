"""`python manage.py reembed <corpus> --model NAME`: moves a corpus to another embedding model
(apps/rag/reembedding.py) and runs the re-embedding here, in the foreground; its old vectors
answer questions until the new ones are complete. `--drain` runs the jobs started elsewhere (the
admin's "change" link starts them in a web process) from this process instead."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps.rag.fleet import EmbeddingUnavailable
from apps.rag.models import Corpus
from apps.rag.reembedding import ReembedBusy, corpus_model_change, reembed_pending


class Command(BaseCommand):
    help = "Re-embed a corpus with another embedding model, in the background of its searches."

    def add_arguments(self, parser):
        parser.add_argument("corpus", nargs="?", help="corpus name")
        parser.add_argument("--model", help="the embedding model's name (a worker serves it)")
        parser.add_argument("--drain", action="store_true", help="run every waiting job")

    def handle(self, *args, corpus: str | None, model: str | None, drain: bool, **options):
        if corpus:
            if not model:
                raise CommandError("--model is needed with a corpus")
            found = Corpus.objects.filter(name=corpus).first()
            if found is None:
                raise CommandError(f"no such corpus: {corpus}")
            try:
                job = corpus_model_change(corpus=found, model=model)
            except (ReembedBusy, EmbeddingUnavailable) as exc:
                raise CommandError(str(exc)) from exc
            if job is None:
                found.refresh_from_db()
                self.stdout.write(
                    f"{found.name}: {found.embedding_model}, {found.embedding_dimensions} "
                    "dimensions (nothing to re-embed)"
                )
                return
        elif not drain:
            raise CommandError("name a corpus and --model, or --drain")
        ran = reembed_pending()
        for corpus_row in Corpus.objects.filter(reembeddings__isnull=False).distinct():
            job = corpus_row.reembeddings.first()
            self.stdout.write(f"{corpus_row.name}: {job.progress}")
        self.stdout.write(f"{ran} re-embedding job(s) run")
