from __future__ import annotations

from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "apps.inbox"
    label = "inbox"
