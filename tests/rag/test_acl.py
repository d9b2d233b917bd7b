"""A user without access never receives a corpus's chunks, through any endpoint."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from apps.rag.models import Chunk, Corpus
from apps.rag.selectors import corpora_for_user
from apps.rag.services import retrieve_for_prompt
from tests.rag.conftest import FIXTURES

QUERY = "what to do when the coffee machine shows error E42"


@pytest.fixture
def secret(make_corpus):
    """The coffee doc in a corpus only the 'baristas' group may use."""
    corpus = make_corpus(
        "secret", access=Corpus.Access.RESTRICTED, paths=[FIXTURES / "handbook" / "coffee.md"]
    )
    corpus.groups.add(Group.objects.create(name="baristas"))
    return corpus


def test_restricted_corpus_is_invisible_to_outsiders(secret, user, other_user, client_for):
    other_user.groups.add(Group.objects.get(name="baristas"))
    insider = retrieve_for_prompt(user=other_user, query=QUERY)
    assert insider and insider[0].corpus_id == secret.pk

    # Same question, same cache: the outsider still gets nothing (the cache key holds the
    # searched corpora, and they differ).
    assert retrieve_for_prompt(user=user, query=QUERY) == []
    assert retrieve_for_prompt(user=user, query=QUERY, corpora=[secret.pk, "secret"]) == []

    client = client_for(user)
    chunk = Chunk.objects.filter(corpus=secret).first()
    assert client.get(reverse("rag:chunk", args=[chunk.pk])).status_code == 404
    assert client.get(reverse("rag:document", args=[chunk.document_id])).status_code == 404
    page = client_for(other_user).get(reverse("rag:chunk", args=[chunk.pk]))
    assert page.status_code == 200
    assert "Brasswell 9000" in page.content.decode()


def test_outsiders_see_only_the_open_corpus(secret, handbook, user):
    passages = retrieve_for_prompt(user=user, query=QUERY, k=10)
    assert passages and {p.corpus_id for p in passages} == {handbook.pk}


def test_inactive_corpora_and_anonymous_users_get_nothing(handbook, user):
    from django.contrib.auth.models import AnonymousUser

    assert retrieve_for_prompt(user=AnonymousUser(), query=QUERY) == []
    Corpus.objects.filter(pk=handbook.pk).update(is_active=False)
    assert retrieve_for_prompt(user=user, query=QUERY) == []


def test_source_view_needs_login(handbook, client):
    chunk = Chunk.objects.filter(corpus=handbook).first()
    response = client.get(reverse("rag:chunk", args=[chunk.pk]))
    assert response.status_code == 302 and "/accounts/login" in response["Location"]


def test_admin_try_a_query_as_a_user_applies_their_acl(secret, user, client_for):
    from apps.accounts.services import user_create

    admin = user_create(username="root", password="correct-horse-battery")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client = client_for(admin)
    url = reverse("admin:rag_corpus_try")
    as_admin = client.get(url, {"query": QUERY, "k": 5}).content.decode()
    assert "The office coffee machine" in as_admin
    as_user = client.get(url, {"query": QUERY, "k": 5, "as_user": user.username}).content.decode()
    assert "The office coffee machine" not in as_user and "No passage matched." in as_user
    assert list(corpora_for_user(user=user)) == []


def test_plan_restricted_corpus_follows_the_users_plan(make_corpus, user, other_user):
    from apps.admission.models import Plan, UserPlan

    corpus = make_corpus(
        "premium",
        access=Corpus.Access.RESTRICTED,
        plans=["pro"],
        paths=[FIXTURES / "handbook" / "coffee.md"],
    )
    pro = Plan.objects.create(slug="pro", name="Pro")
    UserPlan.objects.create(user=other_user, plan=pro)
    assert [p.corpus_id for p in retrieve_for_prompt(user=other_user, query=QUERY)][:1] == [
        corpus.pk
    ]
    assert retrieve_for_prompt(user=user, query=QUERY) == []  # on the default plan
