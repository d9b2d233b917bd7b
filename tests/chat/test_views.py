from __future__ import annotations

import pytest
from django.urls import reverse

from apps.chat.models import Conversation, Message
from apps.chat.services import conversation_create, message_create
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db


def test_new_chat_send_message_and_see_it(user, client_for):
    client = client_for(user)
    conversation = conversation_create(owner=user)  # an untitled chat from before

    client.post(reverse("chat:send", args=[conversation.id]), {"text": "Hello <b>there</b>"})
    message = Message.objects.get(conversation=conversation)
    assert (message.role, message.text) == ("user", "Hello <b>there</b>")

    page = client.get(reverse("chat:conversation", args=[conversation.id])).content.decode()
    assert "Hello &lt;b&gt;there&lt;/b&gt;" in page  # shown, escaped
    conversation.refresh_from_db()
    assert conversation.title == "Hello <b>there</b>"  # first question names the chat


def test_htmx_send_renders_only_the_conversation_pane(user, client_for):
    conversation = conversation_create(owner=user)
    response = client_for(user).post(
        reverse("chat:send", args=[conversation.id]), {"text": "hi"}, HTTP_HX_REQUEST="true"
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body
    assert 'id="message-list"' in body and "hi" in body


@pytest.mark.parametrize(
    ("text", "error"),
    [("   ", "Type a message first."), ("x" * 8001, "the limit is 8,000")],
)
def test_bad_messages_get_a_clear_error_and_keep_the_draft(user, client_for, text, error):
    conversation = conversation_create(owner=user)
    response = client_for(user).post(
        reverse("chat:send", args=[conversation.id]), {"text": text}, HTTP_HX_REQUEST="true"
    )
    assert error in response.content.decode()
    assert not Message.objects.exists()


def test_rename_and_delete(user, client_for):
    client = client_for(user)
    conversation = conversation_create(owner=user)
    client.post(reverse("chat:rename", args=[conversation.id]), {"title": "  Trip   plans "})
    conversation.refresh_from_db()
    assert conversation.title == "Trip plans"

    client.post(reverse("chat:rename", args=[conversation.id]), {"title": "   "})
    conversation.refresh_from_db()
    assert conversation.title == "Trip plans"

    client.post(reverse("chat:delete", args=[conversation.id]))
    assert not Conversation.objects.filter(id=conversation.id).exists()


def test_sidebar_lists_only_my_conversations(user, other_user, client_for):
    conversation_create(owner=user, title="Mine")
    conversation_create(owner=other_user, title="Theirs")
    page = client_for(user).get(reverse("chat:index"), follow=True).content.decode()
    assert "Mine" in page and "Theirs" not in page


@pytest.mark.parametrize(
    ("method", "name", "data"),
    [
        ("get", "chat:conversation", None),
        ("post", "chat:rename", {"title": "pwned"}),
        ("post", "chat:delete", None),
        ("post", "chat:send", {"text": "hello"}),
    ],
)
def test_another_users_conversation_is_404_everywhere(
    user, other_user, client_for, method, name, data
):
    theirs = conversation_create(owner=other_user, title="Private")
    message_create(conversation=theirs, role="user", text="secret")
    response = getattr(client_for(user), method)(reverse(name, args=[theirs.id]), data or {})
    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.title == "Private"
    assert theirs.messages.count() == 1


def test_chat_pages_require_login(client):
    assert client.get(reverse("chat:index")).status_code == 302


@pytest.mark.parametrize("stored", [False, True])
def test_an_answer_stored_just_before_its_release_is_shown_once(user, client_for, stored):
    """Between storing an answer and releasing its conversation the request is still the
    conversation's active one: a page loaded then shows the stored answer, not a second bubble
    still waiting for it."""
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="A question")
    get_redis().set(keys().conversation_active(conversation.id), "req-just-stored", ex=60)
    if stored:
        message_create(
            conversation=conversation,
            role="assistant",
            text="The answer",
            request_id="req-just-stored",
        )
    page = client_for(user).get(reverse("chat:conversation", args=[conversation.id]))
    assert page.status_code == 200
    assert (b'data-request-id="req-just-stored"' in page.content) is not stored
    assert page.content.count(b"The answer") == (1 if stored else 0)
