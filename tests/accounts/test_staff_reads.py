"""Staff and other people's conversations: staff status reads nothing; the permission reads
after a reason, each read is recorded in a log nobody can change, and the person sees it."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test import Client
from django.urls import reverse

from apps.accounts.models import StaffRead, User
from apps.accounts.services import user_create
from apps.chat.services import conversation_create, message_create
from apps.usage.models import Feedback

pytestmark = pytest.mark.django_db

REASON = "Abuse report #12 names this conversation"


def staff(username: str, *permissions: str) -> User:
    user = User.objects.create_user(username=username, password="x-long-passphrase-1")
    user.is_staff = True
    user.save()
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return User.objects.get(pk=user.pk)  # permissions are cached per instance


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def chat(user):
    conversation = conversation_create(owner=user, title="Alice's private chat")
    question = message_create(conversation=conversation, role="user", text="my secret question")
    answer = message_create(
        conversation=conversation, role="assistant", text="the secret answer", request_id="req-a1"
    )
    return conversation, question, answer


@pytest.fixture
def plain_staff():
    """Staff with every ordinary permission on conversations, but not the reading one."""
    return staff(
        "plain-staff", "view_conversation", "change_conversation", "view_message", "view_staffread"
    )


@pytest.fixture
def reader():
    return staff("kim-ops", "read_others_conversations")


def test_staff_without_the_permission_gets_403_in_the_admin_and_the_inspector(chat, plain_staff):
    conversation, _, answer = chat
    client = client_for(plain_staff)
    for url in (
        reverse("admin:chat_conversation_change", args=[conversation.pk]),
        reverse("admin:chat_conversation_delete", args=[conversation.pk]),
        reverse("admin:chat_conversation_history", args=[conversation.pk]),
        reverse("admin:chat_message_change", args=[answer.pk]),
        reverse("ops:request_text", args=["req-a1"]),
    ):
        response = client.get(url)
        assert response.status_code == 403, url
        assert b"secret" not in response.content
    assert client.get(reverse("admin:chat_conversation_changelist")).status_code == 403
    index = client.get(reverse("admin:index")).content.decode()
    assert "/admin/chat/conversation/" not in index
    assert "/admin/chat/message/" not in index
    inspector = client.get(reverse("ops:request", args=["req-a1"])).content.decode()
    assert "secret" not in inspector
    assert reverse("ops:request_text", args=["req-a1"]) not in inspector
    assert not StaffRead.objects.exists()


def test_a_reader_gives_a_reason_reads_and_the_read_is_recorded(chat, reader, user):
    conversation, _, _ = chat
    client = client_for(reader)
    url = reverse("admin:chat_conversation_change", args=[conversation.pk])

    listing = client.get(reverse("admin:chat_conversation_changelist")).content.decode()
    assert f"Conversation {conversation.pk}" in listing
    assert "Alice's private chat" not in listing  # a title is the first question's words

    asked = client.get(url)
    assert asked.status_code == 200
    assert b"secret" not in asked.content
    assert b"Why do you need to read this?" in asked.content

    too_short = client.post(url, {"staff_read_reason": "because"})
    assert b"secret" not in too_short.content
    assert not StaffRead.objects.exists()

    given = client.post(url, {"staff_read_reason": REASON}, REMOTE_ADDR="192.0.2.7")
    assert given.status_code == 302 and given.headers["Location"] == url
    page = client.get(url).content.decode()
    assert "my secret question" in page and "the secret answer" in page

    read = StaffRead.objects.get()
    assert (read.reader_id, read.owner_id) == (reader.pk, user.pk)
    assert (read.subject, read.subject_id, read.reason) == (
        "conversation",
        str(conversation.pk),
        REASON,
    )
    assert read.address == "192.0.2.7"

    # The conversation's grant opens its messages and its requests' text, without a new record.
    answer = conversation.messages.get(role="assistant")
    assert (
        b"the secret answer"
        in client.get(reverse("admin:chat_message_change", args=[answer.pk])).content
    )
    text = client.get(reverse("ops:request_text", args=["req-a1"])).content.decode()
    assert "my secret question" in text and "the secret answer" in text
    assert StaffRead.objects.count() == 1


def test_a_superuser_is_asked_for_a_reason_and_recorded_too(chat):
    root = user_create(username="root", password="x-long-passphrase-1", is_staff=True)
    client = client_for(root)
    url = reverse("ops:request_text", args=["req-a1"])
    assert b"secret" not in client.get(url).content
    client.post(url, {"staff_read_reason": REASON})
    assert b"the secret answer" in client.get(url).content
    read = StaffRead.objects.get()
    assert (read.reader_name, read.subject, read.subject_id) == ("root", "request", "req-a1")


def test_the_owner_sees_when_staff_read_their_conversation_and_why(chat, reader, user):
    conversation, _, _ = chat
    url = reverse("admin:chat_conversation_change", args=[conversation.pk])
    client_for(reader).post(url, {"staff_read_reason": "<b>Support ticket</b> 881, asked by you"})
    page = client_for(user).get(reverse("accounts:privacy")).content.decode()
    assert f"conversation {conversation.pk}" in page
    assert "&lt;b&gt;Support ticket&lt;/b&gt; 881" in page  # the reason, escaped
    assert "kim-ops" not in page  # staff are not named to the public
    assert "accounts/privacy/" in client_for(user).get(reverse("accounts:profile")).content.decode()
    # Nobody else's reads show on another person's page.
    other = user_create(username="bob", password="x-long-passphrase-1")
    assert (
        "Support ticket" not in client_for(other).get(reverse("accounts:privacy")).content.decode()
    )


def test_the_log_cannot_be_changed_or_deleted_through_the_admin_or_the_model(chat, reader, user):
    conversation, _, _ = chat
    client = client_for(reader)
    client.post(
        reverse("admin:chat_conversation_change", args=[conversation.pk]),
        {"staff_read_reason": REASON},
    )
    read = StaffRead.objects.get()
    listing = client.get(reverse("admin:accounts_staffread_changelist"))
    assert listing.status_code == 200 and REASON in listing.content.decode()
    change = reverse("admin:accounts_staffread_change", args=[read.pk])
    assert client.get(change).status_code == 200  # shown read-only
    client.post(change, {"reason": "nothing to see"})
    assert client.get(reverse("admin:accounts_staffread_add")).status_code == 403
    assert client.post(reverse("admin:accounts_staffread_delete", args=[read.pk])).status_code in (
        403,
    )
    client.post(
        reverse("admin:accounts_staffread_changelist"),
        {"action": "delete_selected", "_selected_action": [read.pk], "post": "yes"},
    )
    assert StaffRead.objects.get().reason == REASON

    read.reason = "rewritten"
    with pytest.raises(PermissionError):
        read.save()
    with pytest.raises(PermissionError):
        read.delete()
    with pytest.raises(PermissionError):
        StaffRead.objects.filter(pk=read.pk).update(reason="rewritten")
    with pytest.raises(PermissionError):
        StaffRead.objects.all().delete()
    for statement in (
        "UPDATE accounts_staffread SET reason = 'rewritten'",
        "DELETE FROM accounts_staffread",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement)
    assert StaffRead.objects.get().reason == REASON
    # Deleting the person keeps the record of what was read of them.
    user.delete()
    assert StaffRead.objects.get().owner_name == "alice"


def test_the_log_is_hidden_from_staff_without_either_permission(chat):
    nobody = staff("nobody", "view_conversation")
    response = client_for(nobody).get(reverse("admin:accounts_staffread_changelist"))
    assert response.status_code == 403


def test_feedback_comments_need_the_permission_and_a_reason(chat, plain_staff, reader, user):
    Feedback.objects.create(
        user=user, request_id="req-a1", vote=Feedback.DOWN, comment="my private complaint"
    )
    url = reverse("ops:feedback")
    assert b"my private complaint" not in client_for(plain_staff).get(url).content
    plain_csv = b"".join(
        client_for(plain_staff)
        .post(reverse("ops:feedback_csv"), {"staff_read_reason": REASON})
        .streaming_content
    )
    assert b"my private complaint" not in plain_csv

    client = client_for(reader)
    page = client.get(url).content.decode()
    assert "my private complaint" not in page and "Show comments" in page
    shown = client.post(url, {"staff_read_reason": REASON}).content.decode()
    assert "my private complaint" in shown
    read = StaffRead.objects.get()
    assert (read.owner_id, read.subject, read.subject_id) == (user.pk, "feedback comment", "req-a1")

    exported = client.post(reverse("ops:feedback_csv"), {"staff_read_reason": REASON})
    rows = list(csv.reader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert rows[0][-1] == "comment" and rows[1][-1] == "my private complaint"
    assert StaffRead.objects.count() == 2
    plain_export = b"".join(client.get(reverse("ops:feedback_csv")).streaming_content)
    assert b"my private complaint" not in plain_export


def test_the_words_a_reader_opens_are_shown_as_text(user, reader):
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="<script>alert(1)</script>")
    message_create(
        conversation=conversation,
        role="assistant",
        text="<img src=x onerror=alert(2)>",
        request_id="req-x",
    )
    client = client_for(reader)
    for url in (
        reverse("ops:request_text", args=["req-x"]),
        reverse("admin:chat_conversation_change", args=[conversation.pk]),
    ):
        client.post(url, {"staff_read_reason": REASON})
        page = client.get(url).content.decode()
        assert "<script>alert(1)" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
