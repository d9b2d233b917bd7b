from __future__ import annotations

from django.apps import AppConfig


class RagConfig(AppConfig):
    name = "apps.rag"
    label = "rag"

    def ready(self) -> None:
        from apps.rag import signals

        signals.connect()  # a corpus is recounted when its documents are deleted
