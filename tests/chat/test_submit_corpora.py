"""Every kind of change to who may search what reaches the very next submit, and nobody else's.

Real PostgreSQL and Redis; real transactions (each write commits, as in the service)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import transaction

from apps.admission.models import Plan
from apps.admission.services import plan_assign, plan_make_default
from apps.chat.services import conversation_create
from apps.chat.submission import Question, request_submit
from apps.rag import services
from apps.rag.embeddings import DIMENSIONS
from apps.rag.ingestion import corpus_refresh_counts
from apps.rag.models import Chunk, Corpus, Document
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "How do rivers form?"


@pytest.fixture
def searched(monkeypatch) -> list[set[str]]:
    """The names of the corpora each submit searched, as retrieval received them."""
    seen: list[set[str]] = []
    real = services.searchable_corpora_for_user

    def recorded(*, user):
        corpora = real(user=user)
        seen.append({c.name for c in corpora})
        return corpora

    monkeypatch.setattr(services, "searchable_corpora_for_user", recorded)
    return seen


@pytest.fixture
def world(db, user, other_user):
    basic = Plan.objects.create(slug="basic", name="Basic")
    plan_make_default(plan=basic)
    pro = Plan.objects.create(slug="pro", name="Pro")
    readers = Group.objects.create(name="readers")

    def make(name, **fields):
        return Corpus.objects.create(name=name, chunk_count=fields.pop("chunks", 3), **fields)

    make("open", access=Corpus.Access.EVERYONE)
    make("by-group").groups.add(readers)
    make("by-pro", plans=["pro"])
    make("by-basic", plans=["basic"])
    make("closed")
    return {
        "basic": basic,
        "pro": pro,
        "readers": readers,
        "make": make,
        "chats": {u.pk: conversation_create(owner=u) for u in (user, other_user)},
    }


def submit(world, person, searched) -> set[str]:
    """One question through the real submit path; the corpora it searched."""
    conversation = world["chats"][person.pk]
    request_submit(Question(user=person, conversation=conversation, text=QUESTION))
    get_redis().delete(keys().conversation_active(conversation.id))  # as if it was answered
    return searched[-1]


def test_corpus_edits_reach_the_next_submit(world, user, searched):
    assert submit(world, user, searched) == {"open", "by-basic"}
    world["make"]("news", access=Corpus.Access.EVERYONE)  # created
    assert submit(world, user, searched) == {"open", "by-basic", "news"}
    news = Corpus.objects.get(name="news")
    news.plans, news.access = ["pro"], Corpus.Access.RESTRICTED  # saved, as the admin does
    news.save()
    assert submit(world, user, searched) == {"open", "by-basic"}
    Corpus.objects.filter(name="by-pro").update(plans=["pro", "basic"])  # a queryset update
    assert submit(world, user, searched) == {"open", "by-basic", "by-pro"}
    Corpus.objects.filter(name="open").update(is_active=False)
    assert submit(world, user, searched) == {"by-basic", "by-pro"}
    Corpus.objects.filter(name="by-basic").delete()
    assert submit(world, user, searched) == {"by-pro"}
    Corpus.objects.get(name="closed").groups.add(world["readers"])
    user.groups.add(world["readers"])
    assert submit(world, user, searched) == {"by-pro", "by-group", "closed"}
    world["readers"].corpora.remove(Corpus.objects.get(name="closed"))  # from the group's side
    assert submit(world, user, searched) == {"by-pro", "by-group"}


def test_groups_and_plans_reach_the_next_submit(world, user, other_user, searched):
    assert submit(world, user, searched) == {"open", "by-basic"}
    user.groups.add(world["readers"])
    assert submit(world, user, searched) == {"open", "by-basic", "by-group"}
    world["readers"].user_set.remove(user)  # from the group's side
    assert submit(world, user, searched) == {"open", "by-basic"}
    world["readers"].user_set.add(user, other_user)
    assert submit(world, user, searched) == {"open", "by-basic", "by-group"}
    world["readers"].user_set.clear()
    assert submit(world, user, searched) == {"open", "by-basic"}
    user.groups.add(world["readers"])
    world["readers"].delete()
    assert submit(world, user, searched) == {"open", "by-basic"}

    plan_assign(user=user, plan=world["pro"])  # the user's own plan
    assert submit(world, user, searched) == {"open", "by-pro"}
    plan_assign(user=user, plan=None)
    assert submit(world, user, searched) == {"open", "by-basic"}
    plan_make_default(plan=world["pro"])  # the default moves: everybody on it follows
    assert submit(world, user, searched) == {"open", "by-pro"}
    Plan.objects.filter(slug="pro").update(slug="premium")  # renamed in bulk
    assert submit(world, user, searched) == {"open"}


def _document_with_a_chunk(corpus: Corpus, source: str) -> None:
    document = Document.objects.create(
        corpus=corpus,
        title=source,
        source=source,
        kind="text",
        content="Rivers form.",
        checksum="0" * 64,
        pipeline="t",
    )
    Chunk.objects.create(
        corpus=corpus,
        document=document,
        ordinal=0,
        text="Rivers form.",
        token_count=3,
        char_start=0,
        char_end=12,
        embedding=[1.0] + [0.0] * (DIMENSIONS - 1),
    )


def test_a_corpus_whose_last_document_is_deleted_is_not_searched(world, user, searched):
    notes = world["make"]("notes", access=Corpus.Access.EVERYONE, chunks=0)
    _document_with_a_chunk(notes, "a.txt")
    _document_with_a_chunk(notes, "b.txt")
    corpus_refresh_counts(corpus_id=notes.pk)
    assert submit(world, user, searched) == {"open", "by-basic", "notes"}
    Document.objects.filter(corpus=notes, source="a.txt").delete()
    assert submit(world, user, searched) == {"open", "by-basic", "notes"}
    Document.objects.filter(corpus=notes).delete()  # its last, through a queryset
    assert Corpus.objects.get(pk=notes.pk).chunk_count == 0
    assert submit(world, user, searched) == {"open", "by-basic"}


def test_a_change_for_one_user_changes_only_what_they_search(world, user, other_user, searched):
    submit(world, user, searched)
    submit(world, other_user, searched)
    user.groups.add(world["readers"])
    plan_assign(user=user, plan=world["pro"])
    mine = world["make"]("user-files", access=Corpus.Access.PRIVATE, owner=user)
    Corpus.objects.filter(pk=mine.pk).update(chunk_count=5)  # their own file was read
    assert submit(world, user, searched) == {"open", "by-pro", "by-group", "user-files"}
    assert submit(world, other_user, searched) == {"open", "by-basic"}


def test_a_change_rolled_back_never_reaches_a_submit(world, user, searched):
    assert submit(world, user, searched) == {"open", "by-basic"}
    with pytest.raises(RuntimeError), transaction.atomic():
        plan_assign(user=user, plan=world["pro"])
        # Inside, the transaction's own view.
        assert {c.name for c in services.searchable_corpora_for_user(user=user)} == {
            "open",
            "by-pro",
        }
        raise RuntimeError("rolled back")
    assert submit(world, user, searched) == {"open", "by-basic"}
