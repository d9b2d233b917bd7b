"""The statements every answer runs are prepared on the connection after a few uses, and their
errors reach callers as Django's."""

from __future__ import annotations

import pytest
from django.db import DataError, connection

from apps.chat import services
from apps.chat.models import Message
from core.prepared import prepared_cursor

pytestmark = pytest.mark.django_db


def test_the_question_insert_is_prepared_after_a_few_uses(user):
    conversation = services.conversation_create(owner=user)
    for n in range(6):
        services.message_create(
            conversation=conversation, role=Message.Role.USER, text=f"question {n}"
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [row[0] for row in cursor.fetchall()]
    assert any("INSERT INTO chat_message" in statement for statement in statements)
    assert conversation.messages.count() == 6


def test_a_prepared_statements_error_is_djangos():
    with pytest.raises(DataError), prepared_cursor() as cursor:
        cursor.execute("SELECT %s::int", ["not a number"])
