"""Lifts suspensions whose time is up; run it from cron every few minutes."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from apps.accounts.services import suspensions_lift_expired


class Command(BaseCommand):
    help = "Lift suspensions whose time is up (their sign-in lifts them too)."

    def handle(self, *args, **options) -> None:
        lifted = suspensions_lift_expired()
        self.stdout.write(f"{lifted} suspension(s) lifted.")
