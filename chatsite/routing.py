from __future__ import annotations

from django.urls import path

from apps.chat.consumers import ChatConsumer
from apps.inbox.consumers import InboxConsumer

websocket_urlpatterns = [
    path("ws/chat/<int:conversation_id>/", ChatConsumer.as_asgi()),
    path("ws/inbox/", InboxConsumer.as_asgi()),
]
