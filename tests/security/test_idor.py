"""No user reaches another user's objects through any route.

Generated from the URL conf and the websocket routes: every pattern with an id-like parameter is
requested by user B (who owns nothing) with each of user A's object ids, by GET and by POST. A
route added later is swept without anyone adding it here. B may only be told no (404, 403, 401,
405) or be sent to a login page; and A's objects must be untouched afterwards.
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, Permission
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from apps.accounts.models import ApiKey
from apps.accounts.services import api_key_create
from apps.chat import submission
from apps.chat.models import Conversation
from apps.chat.services import conversation_create, message_create
from apps.ops.models import Report
from apps.rag.embeddings import DIMENSIONS
from apps.rag.models import Chunk, Corpus, Document
from apps.rag.user_files import user_file_accept
from chatsite.routing import websocket_urlpatterns
from core.redis_client import get_redis, keys
from tests.security.conftest import logged_in, websocket

pytestmark = pytest.mark.django_db(transaction=True)

PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")
LOGIN_PAGES = ("/accounts/login/", "/admin/login/")


def id_like(name: str) -> bool:
    return name in ("id", "pk") or name.endswith("_id")


def routes(patterns, prefix: str = ""):
    """(route, pattern) for every endpoint, with the routes of the resolvers above it."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern


def swept_routes(patterns) -> list[str]:
    """The routes with id-like parameters only (regex routes such as the admin's app index
    take none)."""
    swept = []
    for route, _ in routes(patterns):
        names = [m["name"] for m in PARAMETER.finditer(route)]
        if names and all(id_like(name) for name in names) and "(?P<" not in route:
            swept.append(route)
    return swept


def filled(route: str, value: str) -> str:
    return "/" + PARAMETER.sub(value, route).lstrip("^").rstrip("$")


@pytest.fixture
def owned_by_a(user):
    """One of everything user A owns or alone may read; their ids."""
    conversation = conversation_create(owner=user, title="A's private chat")
    message = message_create(conversation=conversation, role="user", text="A's secret")
    answer = message_create(conversation=conversation, role="assistant", text="A's answer")
    report = Report.objects.create(
        reporter=user,
        conversation_id=conversation.id,
        message_id=answer.id,
        reported_text="A's answer",
        context="A's secret",
        details="A's note",
        category="other",
    )
    key, _ = api_key_create(user=user, name="A's key")
    submitted = submission.request_submit(
        submission.Question(user=user, conversation=conversation, text="A asks")
    )
    corpus = Corpus.objects.create(name="a-only", access=Corpus.Access.RESTRICTED)
    group = Group.objects.create(name="a-group")
    corpus.groups.add(group)
    user.groups.add(group)
    document = Document.objects.create(
        corpus=corpus,
        title="A's document",
        source="a.md",
        kind="md",
        content="classified",
        checksum="0" * 64,
        pipeline="test",
    )
    chunk = Chunk.objects.create(
        corpus=corpus,
        document=document,
        ordinal=0,
        text="classified",
        token_count=1,
        char_start=0,
        char_end=10,
        embedding=[1.0] + [0.0] * (DIMENSIONS - 1),
    )
    ids = {
        conversation.id,
        message.id,
        answer.id,
        report.id,
        key.id,
        corpus.id,
        document.id,
        chunk.id,
        user.id,
        user.profile.id,
    }
    return {
        "conversation": conversation,
        "key": key,
        "request_id": submitted.request_id,
        "values": [*sorted(str(i) for i in ids), submitted.request_id],
    }


def test_the_sweep_covers_every_route_with_an_id(owned_by_a):
    swept = swept_routes(get_resolver().url_patterns)
    for route in (
        "c/<int:id>/",
        "api/v1/requests/<str:request_id>/cancel",
        "accounts/profile/api-keys/<int:key_id>/revoke/",
        "rag/chunks/<int:chunk_id>/",
        "admin/chat/conversation/<path:object_id>/change/",
        "admin/ops/request/<str:request_id>/text/",
        "admin/accounts/staffread/<path:object_id>/change/",
        "v1/responses/<str:response_id>",
        "report/answer/<int:message_id>/",
        "admin/ops/report/<path:object_id>/change/",
    ):
        assert route in swept


def test_no_route_gives_user_b_anything_of_user_as(owned_by_a, other_user):
    client, _ = logged_in(other_user)
    refused = []
    for route in swept_routes(get_resolver().url_patterns):
        for value in owned_by_a["values"]:
            url = filled(route, value)
            try:
                resolve(url)
            except Exception:
                continue  # a value the route's converter does not take (a request id as <int>)
            for method in ("get", "post"):
                response = getattr(client, method)(url)
                location = response.headers.get("Location", "")
                told_no = response.status_code in (401, 403, 404, 405)
                sent_to_login = response.status_code == 302 and location.startswith(LOGIN_PAGES)
                if not (told_no or sent_to_login):
                    refused.append(f"{method.upper()} {url} -> {response.status_code} {location}")
    assert not refused, "user B reached user A's objects:\n" + "\n".join(refused)

    conversation = Conversation.objects.get(pk=owned_by_a["conversation"].pk)
    assert conversation.title == "A's private chat"
    assert conversation.messages.count() == 3  # the secret, an answer, the question submitted
    assert Report.objects.count() == 1  # B reported nothing of A's
    assert not ApiKey.objects.get(pk=owned_by_a["key"].pk).revoked
    request = get_redis().hgetall(keys().request(owned_by_a["request_id"]))
    assert request["state"] == "queued"
    assert not get_redis().exists(keys().cancel(owned_by_a["request_id"]))


@pytest.mark.usefixtures("close_thread_connections")
async def test_no_websocket_route_opens_for_user_b_on_user_as_objects(owned_by_a, other_user):
    _, key = await sync_to_async(logged_in)(other_user)
    swept = swept_routes(websocket_urlpatterns)
    assert swept
    for route in swept:
        for value in owned_by_a["values"]:
            path = filled(route, value)
            if not any(p.pattern.match(path.lstrip("/")) for p in websocket_urlpatterns):
                continue  # a value the route's converter does not take
            async with websocket(path, session_key=key) as (_, accepted, _):
                assert not accepted, (route, value)


def test_staff_without_the_read_permission_see_no_words_of_user_as(owned_by_a, other_user):
    """Staff holding every other permission (every admin page, the operations pages) are
    told no or shown pages without a word of what A wrote: reading someone's conversation is
    a permission of its own (apps/accounts/read_gate.py)."""
    other_user.is_staff = True
    other_user.save()
    other_user.user_permissions.set(
        Permission.objects.exclude(codename="read_others_conversations")
    )
    a_file, _ = user_file_accept(
        owner=owned_by_a["conversation"].owner, name="A-diary.txt", data=b"dear diary"
    )
    client, _ = logged_in(other_user)
    words = ("A's secret", "A asks", "A's private chat", "A-diary", "dear diary", "A's note")
    leaked = []
    every = [route for route, _ in routes(get_resolver().url_patterns)]
    staff_pages = [r for r in every if r.startswith("admin/") and "<" not in r and "(?P<" not in r]
    urls = ["/" + r for r in staff_pages]
    for route in swept_routes(get_resolver().url_patterns):
        urls += [filled(route, value) for value in [*owned_by_a["values"], str(a_file.pk)]]
    for url in urls:
        try:
            resolve(url)
        except Exception:
            continue
        response = client.get(url)
        raw = b"".join(response.streaming_content) if response.streaming else response.content
        body = raw.decode(errors="replace")
        leaked += [f"GET {url}: {word}" for word in words if word in body]
    assert not leaked, "staff read A's words without the permission:\n" + "\n".join(leaked)
