"""Reads: which corpora a user may search, and the chunks and documents they may open.

Access is decided here and nowhere else, always in SQL: a user never receives a chunk of a
corpus that `corpora_for_user` does not return. The answer to "which corpora may I search",
asked by every message, is one prepared statement (`searchable_corpora_for_user`).
"""

from __future__ import annotations

from functools import cache

from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404

from apps.admission.plans import FALLBACK_PLAN, plan_slug_sql
from apps.admission.selectors import plan_for_user
from apps.rag.models import Chunk, Corpus, Document
from core.prepared import prepared_cursor


def user_plan_slugs(*, user) -> list[str]:
    """The user's plan, for corpora restricted to plans (the rule: admission's `plan_decide`)."""
    return [plan_for_user(user=user).slug]


def corpora_for_user(*, user) -> QuerySet[Corpus]:
    if user is None or not user.is_authenticated or not user.is_active:
        return Corpus.objects.none()
    allowed = Q(access=Corpus.Access.EVERYONE) | Exists(
        Corpus.groups.through.objects.filter(corpus_id=OuterRef("pk"), group__user=user)
    )
    plans = user_plan_slugs(user=user)
    if plans:
        allowed |= Q(plans__overlap=plans)
    # A private corpus (a user's own files) is its owner's alone, whatever else it says.
    allowed = (Q(owner__isnull=True) & allowed) | Q(owner=user)
    return Corpus.objects.filter(allowed, is_active=True)


@cache
def _fields() -> tuple:
    """The columns a Corpus is read with, in the model's order (what `Model.from_db` takes)."""
    return tuple(Corpus._meta.concrete_fields)


@cache
def _searchable_sql() -> str:
    user_groups = Group.user_set.through._meta.db_table
    columns = ", ".join(f"c.{connection.ops.quote_name(field.column)}" for field in _fields())
    return f"""
        SELECT {columns} FROM {Corpus._meta.db_table} c
        WHERE c.is_active AND c.chunk_count > 0 AND (c.owner_id IS NULL AND (
            c.access = %(everyone)s
            OR EXISTS (
                SELECT 1 FROM {Corpus.groups.through._meta.db_table} cg
                JOIN {user_groups} ug ON ug.group_id = cg.group_id
                WHERE cg.corpus_id = c.id AND ug.user_id = %(user)s)
            OR c.plans && ARRAY[{plan_slug_sql(user="user", fallback="fallback_plan")}]::varchar[]
        )
            -- the user's own files: a private corpus is searched for its owner and nobody else
            OR c.owner_id = %(user)s
        )
        ORDER BY c.id
    """


def searchable_corpora_for_user(*, user) -> list[Corpus]:
    """The corpora with passages that `user` may search: `corpora_for_user` narrowed to those
    with chunks, by the same rule (the user's plan by admission's rule, in SQL; a test keeps
    the two in step). Every message sent asks this, so it is one plain statement, prepared on
    its connection (core/prepared.py): the ORM would spend more CPU building the query, and
    PostgreSQL more planning it, than answering it."""
    if user is None or not user.is_authenticated or not user.is_active:
        return []
    params = {
        "everyone": Corpus.Access.EVERYONE,
        "user": user.pk,
        "fallback_plan": FALLBACK_PLAN.slug,
    }
    with prepared_cursor() as cursor:
        cursor.execute(_searchable_sql(), params)
        rows = cursor.fetchall()
    return [_corpus(row) for row in rows]


def _corpus(row: tuple) -> Corpus:
    """A Corpus from one row of `_searchable_sql`, its values converted as the ORM would."""
    fields = _fields()
    values = [
        field.from_db_value(value, None, connection) if hasattr(field, "from_db_value") else value
        for field, value in zip(fields, row, strict=True)
    ]
    return Corpus.from_db(connection.alias, [field.attname for field in fields], values)


def _may_bypass(user) -> bool:
    # Staff who may read chunks in the admin see them here too; nobody else skips the ACL.
    return bool(user and user.is_active and user.is_staff and user.has_perm("rag.view_chunk"))


def _readable(user) -> Q:
    """Corpora whose passages `user` may open: the ones they may search; for staff, every
    shared corpus too. A private corpus opens for its owner only, staff included."""
    if _may_bypass(user):
        return Q(corpus__owner__isnull=True) | Q(corpus__owner=user)
    return Q(corpus__in=corpora_for_user(user=user))


def chunk_get_for_user(*, user, chunk_id: int) -> Chunk:
    chunks = Chunk.objects.select_related("document", "corpus").filter(_readable(user))
    try:
        return chunks.get(pk=chunk_id)
    except Chunk.DoesNotExist:
        raise Http404("No such passage.") from None


def document_get_for_user(*, user, document_id: int) -> Document:
    documents = Document.objects.select_related("corpus").filter(_readable(user))
    try:
        return documents.get(pk=document_id)
    except Document.DoesNotExist:
        raise Http404("No such document.") from None
