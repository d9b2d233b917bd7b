"""Search across one user's own conversations: PostgreSQL full text over titles and messages,
ranked, with highlighted snippets.

The snippets are built by `ts_headline` with control characters as highlight markers; the
page gets them escaped, with only the markers turned into <mark>, so nothing from a message
(model output included) is ever inserted as HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.db import connection
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from apps.accounts.models import User
from apps.chat.models import Conversation, Message

START, STOP = "\x02", "\x03"
CONFIG = "english"  # the text search configuration: the one the indexes are built with
QUERY_MAX_CHARS = 200
RESULTS_MAX = 20


@dataclass
class SearchHit:
    conversation_id: int
    title: str
    archived: bool
    rank: float
    message_id: int | None  # the best matching message (None: the title matched)
    snippet: str  # with START/STOP around matches

    @property
    def snippet_html(self) -> SafeString:
        return highlight(self.snippet)


def highlight(snippet: str) -> SafeString:
    """The snippet escaped, with only the highlight markers as <mark> elements."""
    parts = []
    for index, piece in enumerate(snippet.split(START)):
        if index == 0:
            parts.append(escape(piece.replace(STOP, "")))
            continue
        marked, _, rest = piece.partition(STOP)
        parts.append(
            f"<mark>{escape(marked.replace(STOP, ''))}</mark>{escape(rest.replace(STOP, ''))}"
        )
    return mark_safe("".join(parts))  # every piece is escaped above


@cache
def _search_sql() -> str:
    conversations, messages = Conversation._meta.db_table, Message._meta.db_table
    options = f"StartSel={START}, StopSel={STOP}, MaxWords=24, MinWords=8, MaxFragments=1"
    return f"""
        WITH q AS (SELECT websearch_to_tsquery('{CONFIG}', %(q)s) AS query),
        hits AS (
            SELECT m.conversation_id, m.id AS message_id, m.text,
                   ts_rank(to_tsvector('{CONFIG}', m.text), q.query) AS rank
            FROM {messages} m JOIN {conversations} c ON c.id = m.conversation_id, q
            WHERE c.owner_id = %(owner)s AND m.role IN ('user', 'assistant')
              AND to_tsvector('{CONFIG}', m.text) @@ q.query
        ),
        best AS (
            SELECT DISTINCT ON (conversation_id) conversation_id, message_id, text, rank
            FROM hits ORDER BY conversation_id, rank DESC, message_id DESC
        ),
        titled AS (
            SELECT c.id, ts_rank(to_tsvector('{CONFIG}', c.title), q.query) * 2 AS rank
            FROM {conversations} c, q
            WHERE c.owner_id = %(owner)s AND to_tsvector('{CONFIG}', c.title) @@ q.query
        )
        SELECT c.id, c.title, c.archived,
               COALESCE(best.rank, 0) + COALESCE(titled.rank, 0) AS rank,
               best.message_id,
               ts_headline('{CONFIG}', COALESCE(best.text, c.title), q.query, '{options}')
        FROM {conversations} c
        LEFT JOIN best ON best.conversation_id = c.id
        LEFT JOIN titled ON titled.id = c.id, q
        WHERE c.owner_id = %(owner)s AND (best.conversation_id IS NOT NULL OR titled.id IS NOT NULL)
        ORDER BY rank DESC, c.updated DESC
        LIMIT %(limit)s
    """


def conversation_search_for_user(
    *, user: User, query: str, limit: int = RESULTS_MAX
) -> list[SearchHit]:
    """The user's own conversations matching `query` (web-search syntax: words, "phrases",
    -excluded, or), best first; [] for a blank query."""
    query = " ".join((query or "").split())[:QUERY_MAX_CHARS]
    if not query:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_search_sql(), {"q": query, "owner": user.pk, "limit": limit})
        return [SearchHit(*row) for row in cursor.fetchall()]
