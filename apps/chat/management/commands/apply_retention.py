"""`manage.py apply_retention`: applies the admin's retention policy once (run it daily from
cron or the scheduler of your deployment), and the usage accounting's (USAGE_REQUEST_DAYS,
USAGE_ROLLUP_DAYS)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from apps.chat.data.retention import retention_apply
from apps.usage.services import usage_retention_apply


class Command(BaseCommand):
    help = (
        "Archive conversations untouched for N days, drop the cold detail of old ones, and "
        "delete usage rows past their retention."
    )

    def handle(self, *args, **options) -> None:
        result = retention_apply()
        self.stdout.write(
            f"archived {result.archived} conversations; dropped {result.deleted_messages} "
            f"old messages from {result.trimmed_conversations} archived conversations"
        )
        usage = usage_retention_apply()
        self.stdout.write(
            f"deleted {usage.requests} per-request usage rows and {usage.hours} hourly sums"
        )
