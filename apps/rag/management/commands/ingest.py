"""`python manage.py ingest <corpus> <paths or globs…>`: adds or updates documents in a corpus."""

from __future__ import annotations

import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.rag.models import Corpus
from apps.rag.services import corpus_get_or_create, corpus_ingest_paths


class Command(BaseCommand):
    help = (
        "Ingest .txt, .md, .html, .pdf and .jsonl files (paths, folders or globs such as "
        "'docs/**/*.md') into a corpus, creating it if needed. Unchanged files are skipped, "
        "changed ones replaced; each unreadable file gets a line in the summary."
    )

    def add_arguments(self, parser):
        parser.add_argument("corpus", help="corpus name (a slug, e.g. handbook)")
        parser.add_argument("paths", nargs="+", help="files, folders or quoted glob patterns")
        parser.add_argument(
            "--access",
            choices=[c.value for c in Corpus.Access],
            default=None,
            help="who may use a corpus this command creates (default: restricted — nobody "
            "until an admin adds groups or plans); an existing corpus keeps its setting",
        )
        parser.add_argument("--description", default="", help="for a new corpus")
        parser.add_argument("--chunk-tokens", type=int, default=None)
        parser.add_argument("--overlap", type=int, default=None)
        parser.add_argument("--batch-size", type=int, default=None, help="embedding batch size")
        parser.add_argument("--force", action="store_true", help="re-embed unchanged files too")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args, corpus: str, paths: list[str], **options):
        try:
            Corpus._meta.get_field("name").run_validators(corpus)
        except ValidationError:
            raise CommandError(
                f"{corpus!r} is not a valid corpus name: use letters, digits, - and _"
            ) from None
        instance, created = corpus_get_or_create(
            name=corpus,
            access=options["access"] or Corpus.Access.RESTRICTED,
            description=options["description"],
        )
        if created:
            who = (
                "everyone signed in"
                if instance.access == Corpus.Access.EVERYONE
                else "nobody yet: choose groups or plans for it in the admin"
            )
            self.stdout.write(f"created corpus {instance.name} (usable by {who})")
        try:
            report = corpus_ingest_paths(
                corpus=instance,
                paths=paths,
                size=options["chunk_tokens"],
                overlap=options["overlap"],
                batch_size=options["batch_size"],
                force=options["force"],
                progress=not options["no_progress"] and sys.stderr.isatty(),
            )
        except ValueError as error:  # chunk size / overlap out of range
            raise CommandError(str(error)) from None
        for line in report.lines():
            self.stdout.write(line)
        if report.failed and not report.documents:
            raise CommandError("nothing could be ingested")
