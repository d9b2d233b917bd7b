"""Creates the demo admin, the demo user and a few profile tags, once; prints the logins."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from apps.accounts.models import Tag, User
from apps.accounts.services import user_create

DEMO_ACCOUNTS = [
    {"username": "admin", "password": "sluice-admin", "is_staff": True},
    {"username": "demo", "password": "sluice-demo", "is_staff": False},
]

DEMO_TAGS = [
    ("Prefers short answers", "short-answers", "Keep answers brief: a few sentences at most."),
    ("Teacher", "teacher", "The user teaches; examples they can reuse in class help."),
    ("Developer", "developer", "The user writes software; code examples are welcome."),
    ("Student", "student", "The user is learning; explain terms and steps plainly."),
]


class Command(BaseCommand):
    help = "Create the demo accounts and tags (idempotent) and print the logins."

    def handle(self, *args, **options):
        for name, slug, hint in DEMO_TAGS:
            Tag.objects.get_or_create(slug=slug, defaults={"name": name, "prompt_hint": hint})
        for account in DEMO_ACCOUNTS:
            if not User.objects.filter(username=account["username"]).exists():
                user_create(**account)
        lines = [
            f"    {a['username']} / {a['password']}" + ("  (admin)" if a["is_staff"] else "")
            for a in DEMO_ACCOUNTS
        ]
        self.stdout.write("[sluice] demo logins:\n" + "\n".join(lines))
