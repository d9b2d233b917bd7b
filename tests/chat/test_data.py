"""A user's own chat data: search (only mine, ranked, escaped snippets), archive, export and
import (a round trip), delete (gone from PostgreSQL and Redis), and the retention policy."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.chat.data.export import conversation_export_data, conversation_import
from apps.chat.data.retention import retention_apply
from apps.chat.data.search import conversation_search_for_user, highlight
from apps.chat.models import Conversation, Message, RetentionPolicy
from apps.chat.prompt.memory_summary import summary_store
from apps.chat.services import conversation_create, message_create
from apps.inbox import services as inbox
from apps.inbox.models import InboxMessage
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db


def chat(owner, title: str, *turns: str) -> Conversation:
    conversation = conversation_create(owner=owner, title=title)
    for n, text in enumerate(turns):
        assistant = n % 2 == 1
        message_create(
            conversation=conversation,
            role="assistant" if assistant else "user",
            text=text,
            request_id=f"{title}-{n}" if assistant else None,
        )
    return conversation


def test_search_finds_only_my_conversations_ranked_with_escaped_snippets(user, other_user):
    mine = chat(
        user,
        "Garden",
        "How deep should tomatoes be planted?",
        "Plant tomatoes deep: <script>alert(1)</script> bury the stem.",
    )
    titled = chat(user, "Tomatoes and basil", "What grows well together?", "Basil.")
    chat(user, "Taxes", "When are taxes due?", "In April.")
    chat(other_user, "Secret tomatoes", "My tomatoes are secret.", "Noted.")

    hits = conversation_search_for_user(user=user, query="tomatoes")
    assert {h.conversation_id for h in hits} == {mine.id, titled.id}
    assert [h.conversation_id for h in hits] == [titled.id, mine.id]  # a title weighs double
    assert (
        hits[0].message_id is None
        and str(hits[0].snippet_html) == "<mark>Tomatoes</mark> and basil"
    )
    best = hits[1]
    assert best.message_id is not None
    html = str(best.snippet_html)
    assert "<mark>" in html and "<script>" not in html
    assert conversation_search_for_user(user=user, query="   ") == []
    assert conversation_search_for_user(user=other_user, query="basil") == []


def test_highlight_escapes_everything_but_the_marks():
    assert str(highlight("a <b>\x02tag\x03</b> & \x02x")) == (
        "a &lt;b&gt;<mark>tag</mark>&lt;/b&gt; &amp; <mark>x</mark>"
    )


def test_the_search_page_and_its_htmx_partial(user, client_for):
    chat(user, "Rivers", "Where do rivers start?", "In the mountains.")
    client = client_for(user)
    page = client.get(reverse("chat:search"), {"q": "mountains"}).content.decode()
    assert "<html" in page and "<mark>mountains</mark>" in page and "Rivers" in page
    partial = client.get(reverse("chat:search"), {"q": "volcano"}, HTTP_HX_REQUEST="true")
    body = partial.content.decode()
    assert "<html" not in body and "No chat matches" in body


def test_archive_and_unarchive(user, client_for):
    conversation = chat(user, "Old plans", "Plan a trip.", "Sure.")
    client = client_for(user)
    client.post(reverse("chat:archive", args=[conversation.id]), {"archived": "1"})
    conversation.refresh_from_db()
    assert conversation.archived
    sidebar = client.get(reverse("chat:new")).content.decode()
    assert "Old plans" not in sidebar
    assert "Old plans" in client.get(reverse("chat:archived")).content.decode()
    assert conversation_search_for_user(user=user, query="trip")[0].archived
    client.post(reverse("chat:archive", args=[conversation.id]), {"archived": "0"})
    conversation.refresh_from_db()
    assert not conversation.archived


def test_another_users_ids_404(user, other_user, client_for):
    theirs = chat(other_user, "Private", "secret", "ok")
    client = client_for(user)
    for url in (
        reverse("chat:export", args=[theirs.id, "json"]),
        reverse("chat:export", args=[theirs.id, "md"]),
    ):
        assert client.get(url).status_code == 404
    assert client.post(reverse("chat:archive", args=[theirs.id])).status_code == 404
    assert client.post(reverse("chat:delete", args=[theirs.id])).status_code == 404
    theirs.refresh_from_db()
    assert not theirs.archived


def test_an_export_round_trips(user, other_user, client_for):
    original = chat(user, "Recipes", "How do I make *bread*?", "Flour, water, salt.\n\n- knead")
    Message.objects.filter(conversation=original, role="assistant").update(
        citations=[{"number": 1, "title": "Baking", "source_url": "/rag/1/"}], pinned=True
    )
    first = original.messages.order_by("id").first()
    summary_store(conversation_id=original.id, upto_message_id=first.id, text="- bakes bread")
    response = client_for(user).get(reverse("chat:export", args=[original.id, "json"]))
    assert response["Content-Disposition"].startswith("attachment;")
    exported = json.loads(response.content)

    copy = conversation_import(owner=other_user, data=exported)
    assert copy.owner == other_user and copy.id != original.id
    again = conversation_export_data(conversation=copy)
    summary = exported["summary"]
    assert (summary["text"], summary["model"], summary["covers"]) == ("- bakes bread", "", 1)
    # The question the summary covers, as memory kept it; the copy's summary holds it too.
    assert [f["value"] for f in summary["facts"]] == ["How do I make *bread*?"]
    assert [m["pinned"] for m in exported["messages"]] == [False, True]
    for volatile in ("created", "updated"):
        exported.pop(volatile), again.pop(volatile)
    assert again == exported

    markdown = client_for(user).get(reverse("chat:export", args=[original.id, "md"]))
    text = markdown.content.decode()
    assert text.startswith("# Recipes") and "How do I make *bread*?" in text and "## Sluice" in text


def test_import_refuses_what_is_not_an_export(user, client_for):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="not a Sluice conversation export"):
        conversation_import(owner=user, data={"messages": []})
    with pytest.raises(ValidationError, match="cannot be read"):
        conversation_import(
            owner=user, data={"format": "sluice-conversation", "messages": [{"role": "hacker"}]}
        )
    assert not Conversation.objects.exists()


def test_all_my_data_in_one_download(user, other_user, client_for):
    chat(user, "Mine", "hello", "hi")
    chat(other_user, "Theirs", "nope", "no")
    inbox.inbox_post(user_id=user.id, kind="announcement", text="Welcome")
    response = client_for(user).get(reverse("chat:export_all"))
    data = json.loads(response.content)
    assert data["user"]["username"] == "alice"
    assert [c["title"] for c in data["conversations"]] == ["Mine"]
    assert [m["text"] for m in data["inbox"]] == ["Welcome"]


def test_delete_leaves_nothing_in_postgresql_or_redis(
    user, client_for, django_capture_on_commit_callbacks
):
    conversation = chat(user, "Gone", "forget me", "forgotten")
    k, redis = keys(), get_redis()
    redis.hset(k.request("Gone-1"), "state", "done")
    redis.xadd(k.output("Gone-1"), {"type": "delta", "text": "forgotten"})
    inbox.inbox_post(
        user_id=user.id,
        kind="answer_ready",
        text="ready",
        data={"conversation_id": conversation.id},
    )
    kept = inbox.inbox_post(user_id=user.id, kind="announcement", text="unrelated")
    with django_capture_on_commit_callbacks(execute=True):
        client_for(user).post(reverse("chat:delete", args=[conversation.id]))
    assert not Conversation.objects.filter(id=conversation.id).exists()
    assert not Message.objects.filter(text__in=["forget me", "forgotten"]).exists()
    assert list(InboxMessage.objects.values_list("id", flat=True)) == [kept.id]
    assert redis.exists(k.request("Gone-1"), k.output("Gone-1")) == 0


def test_retention_archives_idle_chats_and_drops_cold_detail(user):
    idle = chat(user, "Idle", *[f"old turn {n}" for n in range(6)])
    cold = chat(user, "Cold", *[f"cold turn {n}" for n in range(6)])
    fresh = chat(user, "Fresh", "new", "yes")
    now = timezone.now()
    Conversation.objects.filter(id=idle.id).update(updated=now - timedelta(days=40))
    Conversation.objects.filter(id=cold.id).update(updated=now - timedelta(days=400), archived=True)
    policy = RetentionPolicy.objects.create(
        archive_after_days=30, drop_detail_after_days=365, keep_turns=2
    )
    result = retention_apply(policy=policy)
    assert (result.archived, result.trimmed_conversations, result.deleted_messages) == (1, 1, 4)
    archived = dict(Conversation.objects.values_list("title", "archived"))
    assert archived == {"Idle": True, "Cold": True, "Fresh": False}
    assert list(cold.messages.values_list("text", flat=True)) == ["cold turn 4", "cold turn 5"]
    assert idle.messages.count() == 6 and fresh.messages.count() == 2
    idle.refresh_from_db()
    assert idle.updated < now - timedelta(days=39)  # archiving did not count as a touch
