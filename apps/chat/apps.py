from __future__ import annotations

from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "apps.chat"
    label = "chat"

    def ready(self) -> None:
        from apps.chat.prompt import hot_signals

        hot_signals.connect()  # the Redis hot tier follows ORM writes
