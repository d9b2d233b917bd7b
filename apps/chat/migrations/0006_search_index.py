"""Full-text indexes for searching one's own conversations (apps/chat/data/search.py): the same
expressions as the search query, so PostgreSQL uses them."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0005_inbox"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX chat_message_fts ON chat_message "
            "USING gin (to_tsvector('english', text))",
            "DROP INDEX chat_message_fts",
        ),
        migrations.RunSQL(
            "CREATE INDEX chat_conversation_fts ON chat_conversation "
            "USING gin (to_tsvector('english', title))",
            "DROP INDEX chat_conversation_fts",
        ),
    ]
