from __future__ import annotations

from django.apps import AppConfig


class RagConfig(AppConfig):
    name = "apps.rag"
    label = "rag"
