from __future__ import annotations

from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "apps.usage"
    label = "usage"
    verbose_name = "Usage and feedback"
