"""`python manage.py ingest_user_files [--watch]`: ingests the files users attached that are
still waiting (web processes do it themselves; this runs it from a process of its own)."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from apps.rag.user_files import user_files_ingest_pending


class Command(BaseCommand):
    help = "Ingest the files users attached in the chat that are still waiting."

    def add_arguments(self, parser):
        parser.add_argument("--watch", action="store_true", help="keep looking every few seconds")
        parser.add_argument("--interval", type=float, default=2.0)

    def handle(self, *args, watch: bool, interval: float, **options):
        while True:
            count = user_files_ingest_pending()
            if count or not watch:
                self.stdout.write(f"{count} file(s) ingested")
            if not watch:
                return
            time.sleep(interval)
