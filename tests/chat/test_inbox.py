"""The inbox: messages Sluice starts itself reach every open tab of their user live (real
websockets through the ASGI application, the real Redis stream) and wait, unread, for a later
visit; announcements reach the users they are for, and only those."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.urls import reverse

from apps.accounts.services import user_create
from apps.admission.models import Plan, UserPlan
from apps.chat import recorder
from apps.chat.services import conversation_create
from apps.inbox import services as inbox
from apps.inbox.models import Announcement, InboxMessage
from contract.protocol import Answer, State
from core.redis_client import get_redis, keys
from tests.chat.conftest import session_cookie

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_connections"),
]


@asynccontextmanager
async def inbox_socket(user):
    from chatsite.asgi import application

    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", await sync_to_async(session_cookie)(user)),
    ]
    communicator = WebsocketCommunicator(application, "/ws/inbox/", headers=headers)
    connected, code = await communicator.connect(timeout=10)
    assert connected, code
    try:
        yield communicator
    finally:
        await communicator.disconnect()


async def next_messages(ws, timeout: float = 10) -> list[dict]:
    frame = json.loads(await ws.receive_from(timeout=timeout))
    assert frame["type"] == "inbox", frame
    return frame["messages"]


post = sync_to_async(inbox.inbox_post)


async def test_a_message_reaches_two_open_tabs_and_waits_for_a_later_visit(user, other_user):
    async with (
        inbox_socket(user) as tab1,
        inbox_socket(user) as tab2,
        inbox_socket(other_user) as theirs,
    ):
        sent = await post(user_id=user.id, kind="announcement", text="Maintenance at <b>6</b>")
        for tab in (tab1, tab2):
            [message] = await next_messages(tab)
            assert message == {
                "id": sent.id,
                "kind": "announcement",
                "text": "Maintenance at <b>6</b>",
                "data": {},
                "created": message["created"],
            }
        # The other user's tab got none of it: the first message it sees is a later one of theirs.
        own = await post(user_id=other_user.id, kind="announcement", text="For mallory")
        [message] = await next_messages(theirs)
        assert message["id"] == own.id

    # No tab open: kept, and handed to the next page that opens, until it is read.
    later = await post(
        user_id=user.id,
        kind="followups",
        text="Suggested",
        data={"message_id": 7, "questions": ["Why?"]},
    )
    async with inbox_socket(user) as visit:
        ids = [m["id"] for m in await next_messages(visit)]
        assert ids == [sent.id, later.id]
        await visit.send_to(text_data=json.dumps({"type": "read", "ids": ids}))
        await visit.send_to(text_data=json.dumps({"type": "nonsense"}))  # answered: in order
        assert json.loads(await visit.receive_from(timeout=10))["type"] == "error"
    async with inbox_socket(user) as again:
        # All read: a page that opens now is sent none (they would come before this reply).
        await again.send_to(text_data=json.dumps({"type": "nonsense"}))
        assert json.loads(await again.receive_from(timeout=10))["type"] == "error"


async def test_a_user_cannot_mark_or_see_another_users_messages(user, other_user):
    theirs = await post(user_id=other_user.id, kind="announcement", text="For mallory")
    async with inbox_socket(user) as ws:
        await ws.send_to(text_data=json.dumps({"type": "read", "ids": [theirs.id]}))
        await ws.send_to(text_data=json.dumps({"type": "?"}))
        await ws.receive_from(timeout=10)  # the read was handled before this reply
    refreshed = await sync_to_async(InboxMessage.objects.get)(id=theirs.id)
    assert refreshed.read_at is None


async def test_an_anonymous_inbox_socket_is_refused():
    from chatsite.asgi import application

    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    ws = WebsocketCommunicator(application, "/ws/inbox/", headers=headers)
    connected, code = await ws.connect(timeout=10)
    assert not connected and code == 4401


def _plans():
    default = Plan.objects.filter(is_default=True).first() or Plan.objects.create(
        slug="free", name="Free", is_default=True
    )
    pro = Plan.objects.create(slug="pro", name="Pro")
    return default, pro


async def test_an_announcement_reaches_its_plan_only_live_and_stored(user, other_user):
    default, pro = await sync_to_async(_plans)()
    await sync_to_async(UserPlan.objects.create)(user=other_user, plan=pro)
    async with inbox_socket(user) as free_tab, inbox_socket(other_user) as pro_tab:
        await sync_to_async(inbox.announcement_send)(text="Pro models are faster today", plan=pro)
        [message] = await next_messages(pro_tab)
        assert (message["kind"], message["text"]) == ("announcement", "Pro models are faster today")

        # The default plan's users are everyone without another plan. The free tab's first
        # message is this one: it got nothing of the pro plan's.
        sent = await sync_to_async(inbox.announcement_send)(text="Hello free users", plan=default)
        [message] = await next_messages(free_tab)
        assert message["text"] == "Hello free users"

        # Everyone's: each tab's next message is this one, so the pro tab got nothing between.
        everyone = await sync_to_async(inbox.announcement_send)(text="To all", plan=None)
        for tab in (free_tab, pro_tab):
            [message] = await next_messages(tab)
            assert message["text"] == "To all"
    assert sent.recipients == 1
    assert everyone.recipients == 2
    texts = sync_to_async(
        lambda u: list(InboxMessage.objects.filter(user=u).values_list("text", flat=True))
    )
    assert await texts(user) == ["Hello free users", "To all"]
    assert await texts(other_user) == ["Pro models are faster today", "To all"]


async def test_announcements_sent_together_reach_a_tab_once_each(user, monkeypatch):
    """Each announcement makes the tab read its unread messages again; reads that overlap
    (here each read is slowed down, as on a loaded database) would each send what is newer
    than the last message sent, twice."""
    read = inbox.inbox_unread_for_user

    def slow_read(**kwargs):
        time.sleep(0.2)
        return read(**kwargs)

    async with inbox_socket(user) as tab:
        monkeypatch.setattr(inbox, "inbox_unread_for_user", slow_read)
        for n in range(3):
            await sync_to_async(inbox.announcement_send)(text=f"Notice {n}", plan=None)
        received = []
        while len(received) < 3:
            received += [m["text"] for m in await next_messages(tab)]
        assert await tab.receive_nothing(timeout=0.5)
    assert received == ["Notice 0", "Notice 1", "Notice 2"]


def test_an_admin_writes_an_announcement_in_the_admin(client_for):
    admin = user_create(username="root", password="correct-horse-battery")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    reader = user_create(username="reader", password="correct-horse-battery")
    assert client_for(admin).get(reverse("admin:inbox_announcement_add")).status_code == 200
    response = client_for(admin).post(
        reverse("admin:inbox_announcement_add"), {"text": "New models are here", "plan": ""}
    )
    assert response.status_code == 302, response.content[:500]
    announcement = Announcement.objects.get()
    assert announcement.recipients == 2 and announcement.author == admin
    assert InboxMessage.objects.filter(user=reader, text="New models are here").exists()
    # A sent announcement is not sent again by editing it.
    client_for(admin).post(
        reverse("admin:inbox_announcement_change", args=[announcement.pk]), {"text": "changed"}
    )
    assert InboxMessage.objects.filter(user=reader).count() == 1
    page = client_for(admin).get(reverse("admin:inbox_announcement_change", args=[announcement.pk]))
    assert page.status_code == 200 and b"New models are here" in page.content
    policy = {"archive_after_days": "30", "keep_turns": "20"}
    assert (
        client_for(admin).post(reverse("admin:chat_retentionpolicy_add"), policy).status_code == 302
    )
    assert client_for(admin).get(reverse("admin:chat_retentionpolicy_add")).status_code == 403


def test_a_long_answer_leaves_answer_ready_and_a_quick_one_does_not(user, settings):
    settings.INBOX_ANSWER_READY_SECONDS = 20
    conversation = conversation_create(owner=user, title="Rivers")
    client, k = get_redis(), keys()
    now_ms = int(time.time() * 1000)
    client.hset(k.request("slow"), mapping={"created_ms": now_ms - 60_000, "kind": "chat"})
    client.hset(k.request("quick"), mapping={"created_ms": now_ms - 2_000, "kind": "chat"})
    client.hset(k.request("summary"), mapping={"created_ms": now_ms - 60_000, "kind": "background"})
    recorder.ensure_group()
    for rid in ("slow", "quick", "summary"):  # as workers end them: records on the done stream
        client.xadd(
            k.done,
            Answer(
                id=rid,
                user_id=str(user.id),
                state=State.DONE,
                text="...",
                conversation_id=str(conversation.id),
            ).to_fields(),
        )
    assert recorder.record_pending(consumer="c1", block_ms=10) == 3
    [message] = InboxMessage.objects.filter(user=user)
    assert message.kind == "answer_ready" and "Rivers" in message.text
    assert message.data == {
        "conversation_id": conversation.id,
        "request_id": "slow",
        "url": f"/c/{conversation.id}/",
    }


def test_bad_posts_are_refused_clearly(user):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="Unknown inbox kind"):
        inbox.inbox_post(user_id=user.id, kind="spam", text="x")
    with pytest.raises(ValidationError, match="JSON object"):
        inbox.inbox_post(user_id=user.id, kind="followups", text="x", data=["a"])
    assert not InboxMessage.objects.exists()


async def test_the_inbox_socket_closes_when_its_session_ends(user):
    from django.contrib.sessions.models import Session

    from apps.accounts.sessions import AccountEvent, account_event_publish

    async with inbox_socket(user) as ws:
        await sync_to_async(Session.objects.all().delete)()  # e.g. a password reset elsewhere
        await sync_to_async(account_event_publish)(user_id=user.id, kind=AccountEvent.CREDENTIALS)
        closed = await ws.receive_output(timeout=10)
        assert (closed["type"], closed.get("code")) == ("websocket.close", 4401)
