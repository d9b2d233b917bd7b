"""`manage.py apply_retention`: applies the admin's retention policy once (run it daily from
cron or the scheduler of your deployment)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from apps.chat.data.retention import retention_apply


class Command(BaseCommand):
    help = "Archive conversations untouched for N days and drop the cold detail of old ones."

    def handle(self, *args, **options) -> None:
        result = retention_apply()
        self.stdout.write(
            f"archived {result.archived} conversations; dropped {result.deleted_messages} "
            f"old messages from {result.trimmed_conversations} archived conversations"
        )
