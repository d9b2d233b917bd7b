"""`python manage.py reindex [corpus…]`: re-chunks and re-embeds stored documents."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from apps.rag.models import Corpus, Document
from apps.rag.services import documents_reindex


class Command(BaseCommand):
    help = (
        "Re-chunk and re-embed the stored text of every document in the named corpora (all "
        "corpora when none is named), e.g. after changing RAG_CHUNK_TOKENS. Needs no source file."
    )

    def add_arguments(self, parser):
        parser.add_argument("corpora", nargs="*", help="corpus names (default: all)")
        parser.add_argument("--document", type=int, action="append", help="only these ids")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args, corpora: list[str], **options):
        documents = Document.objects.select_related("corpus").order_by("corpus__name", "pk")
        if corpora:
            found = set(Corpus.objects.filter(name__in=corpora).values_list("name", flat=True))
            missing = sorted(set(corpora) - found)
            if missing:
                raise CommandError(f"no such corpus: {', '.join(missing)}")
            documents = documents.filter(corpus__name__in=corpora)
        if options["document"]:
            documents = documents.filter(pk__in=options["document"])
        report = documents_reindex(
            documents=documents,
            progress=not options["no_progress"] and sys.stderr.isatty(),
        )
        for line in report.lines():
            self.stdout.write(line)
