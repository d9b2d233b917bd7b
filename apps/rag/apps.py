from __future__ import annotations

from django.apps import AppConfig


class RagConfig(AppConfig):
    name = "apps.rag"
    label = "rag"

    def ready(self) -> None:
        from apps.rag import signals

        signals.connect()  # the searchable-corpora cache follows every write it depends on
