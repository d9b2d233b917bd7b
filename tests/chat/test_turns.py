"""A conversation is created by its first question (named after it), a sent question can be
edited (the old branch is discarded), and the user's other tabs hear of both."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.http import Http404
from django.urls import reverse

from apps.chat import submission, suggestions, turns
from apps.chat.models import Conversation, ConversationSummary
from apps.chat.services import conversation_create, message_create
from apps.chat.submission import ConversationBusy
from core.redis_client import get_redis, keys
from tests.chat.conftest import chat_socket, receive_until
from tests.conftest import wait_until


@pytest.mark.parametrize(
    ("question", "title"),
    [
        ("what is a sluice gate?", "What is a sluice gate"),
        ("Hello, how do I\nrun the tests?", "How do I"),
        (
            "  Explain   the   difference between threads and processes in Python, with "
            "examples please",
            "Explain the difference between threads and processes in…",
        ),
        ("???", "New chat"),
    ],
)
def test_a_title_is_made_from_the_first_question(question, title):
    assert turns.title_from_question(question) == title


@pytest.mark.django_db
def test_new_chat_is_stored_only_with_its_first_question(user, client_for):
    client = client_for(user)
    page = client.get(reverse("chat:new")).content.decode()
    assert 'id="new-chat-form"' in page and "<textarea" in page
    assert not Conversation.objects.exists()  # opening a new chat stores nothing

    response = client.post(reverse("chat:new"), {"text": "   "})
    assert "Type a message first." in response.content.decode()
    assert not Conversation.objects.exists()

    response = client.post(reverse("chat:new"), {"text": "what is a sluice gate?"})
    conversation = Conversation.objects.get(owner=user)
    assert response["Location"] == reverse("chat:conversation", args=[conversation.id])
    assert conversation.title == "What is a sluice gate"
    assert list(conversation.messages.values_list("role", "text")) == [
        ("user", "what is a sluice gate?")
    ]
    # A "New chat" button that posts nothing opens the composer; no empty chat appears.
    assert client.post(reverse("chat:new"))["Location"] == reverse("chat:new")
    assert Conversation.objects.count() == 1


@pytest.mark.django_db
def test_the_composer_is_ready_right_after_sign_up(client):
    response = client.post(
        reverse("accounts:signup"),
        {
            "username": "newcomer",
            "password1": "a-long-passphrase-9",
            "password2": "a-long-passphrase-9",
        },
        follow=True,
    )
    page = response.content.decode()
    assert 'id="new-chat-form"' in page and 'name="text"' in page


def _history(conversation):
    return list(conversation.messages.values_list("role", "text"))


@pytest.mark.django_db
def test_editing_a_question_discards_what_followed_and_asks_again(user, other_user):
    conversation = conversation_create(owner=user)
    first = message_create(conversation=conversation, role="user", text="Capital of Spain?")
    message_create(conversation=conversation, role="assistant", text="Madrid.")
    message_create(conversation=conversation, role="user", text="And of France?")
    last = message_create(conversation=conversation, role="assistant", text="Paris.")
    ConversationSummary.objects.create(
        conversation=conversation, text="Spain, France", upto_message_id=last.id
    )

    with pytest.raises(ValidationError):
        turns.message_edit(user=user, conversation=conversation, message_id=first.id, text=" ")
    assert len(_history(conversation)) == 4  # a refused edit removes nothing
    answer = conversation.messages.get(text="Madrid.")
    with pytest.raises(Http404):  # only questions can be edited
        turns.message_edit(user=user, conversation=conversation, message_id=answer.id, text="x")
    with pytest.raises(Http404):
        turns.message_edit(
            user=other_user, conversation=conversation, message_id=first.id, text="x"
        )

    submitted, removed = turns.message_edit(
        user=user, conversation=conversation, message_id=first.id, text="Capital of Italy?"
    )
    assert removed == first.id
    assert _history(conversation) == [("user", "Capital of Italy?")]
    assert not ConversationSummary.objects.exists()  # it spoke for the discarded turns
    assert submitted.user_message.text == "Capital of Italy?" and submitted.request_id

    # While that answer is in progress, another edit waits.
    with pytest.raises(ConversationBusy):
        again = submitted.user_message.id
        turns.message_edit(user=user, conversation=conversation, message_id=again, text="Peru?")


def _types(frames: list[dict]) -> set[str]:
    return {frame["type"] for frame in frames}


async def _next(ws, frame_type: str, action: str | None = None) -> dict:
    """The next frame of that type (and action, for "conversation" frames)."""
    while True:
        frame = (await receive_until(ws, frame_type, timeout=10))[-1]
        if action is None or frame.get("action") == action:
            return frame


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
async def test_other_tabs_see_questions_edits_titles_and_deletions(user, client_for):
    here = await sync_to_async(conversation_create)(owner=user, title="Here")
    old = await sync_to_async(message_create)(conversation=here, role="user", text="Old question")
    await sync_to_async(message_create)(conversation=here, role="assistant", text="Old answer")
    elsewhere = await sync_to_async(conversation_create)(owner=user, title="Elsewhere")
    async with (
        chat_socket(user, here.id) as (tab_a, ok_a, _),
        chat_socket(user, here.id) as (tab_b, ok_b, _),
        chat_socket(user, elsewhere.id) as (tab_c, ok_c, _),
    ):
        assert ok_a and ok_b and ok_c
        await tab_a.send_to(
            text_data=json.dumps({"type": "edit", "message_id": old.id, "text": "Edited question"})
        )
        assert (await _next(tab_a, "truncate"))["from_message_id"] == old.id
        mine = await _next(tab_a, "user_message")
        request = await _next(tab_a, "request")

        # The other tab on the conversation drops the old branch, shows the edited question
        # and follows its answer.
        update = await _next(tab_b, "conversation")
        assert (update["action"], update["id"], update["current"]) == ("question", here.id, True)
        assert (await _next(tab_b, "truncate"))["from_message_id"] == old.id
        shown = await _next(tab_b, "user_message")
        assert shown["id"] == mine["id"] and "Edited question" in shown["html"]
        assert (await _next(tab_b, "request"))["request_id"] == request["request_id"]
        # A tab on another conversation moves this one up in its sidebar.
        update = await _next(tab_c, "conversation")
        assert (update["id"], update["current"], update["title"]) == (here.id, False, "Here")

        # A question sent in another conversation reaches the first tab's sidebar.
        await tab_c.send_to(text_data=json.dumps({"type": "send", "text": "Over there"}))
        between = await receive_until(tab_a, "conversation", timeout=10)
        update = between[-1]
        assert (update["action"], update["id"], update["current"]) == (
            "question",
            elsewhere.id,
            False,
        )
        # It is the first tab's next news since its edit: it showed nothing of that twice.
        assert not {"user_message", "request"} & _types(between[:-1]), between

        # The tab that sent it shows its question once, not again from the event: the next
        # conversation news it has is a rename made by a plain page, with no repeat before it.
        await _next(tab_c, "user_message")
        client = await sync_to_async(client_for)(user)
        await sync_to_async(client.post)(
            reverse("chat:rename", args=[here.id]), {"title": "Renamed"}
        )
        between = await receive_until(tab_c, "conversation", timeout=10)
        renamed = between[-1]
        assert (renamed["action"], renamed["title"]) == ("title", "Renamed")
        assert "user_message" not in _types(between[:-1]), between

        # A deletion made by a plain page reaches every tab.
        await sync_to_async(client.post)(reverse("chat:delete", args=[here.id]))
        gone = await _next(tab_b, "conversation", "deleted")
        assert (gone["action"], gone["id"], gone["current"]) == ("deleted", here.id, True)


@pytest.mark.parametrize(
    ("reply", "title"),
    [
        ('"Reversing lists in Python"', "Reversing lists in Python"),
        ("Title: **Sluice gates explained.**", "Sluice gates explained"),
        ("Sure! Here is a title: sluice gates\nThey control water.", "Sluice gates"),
        ("", ""),
        ("This reply is far too long to be the title of anything at all, really", ""),
    ],
)
def test_the_models_title_is_tidied_or_refused(reply, title):
    assert suggestions.title_from_answer(reply) == title


def _chat_events(action: str) -> list[dict]:
    events = get_redis().xrange(keys().account_events)
    return [fields for _, fields in events if fields.get("action") == action]


@pytest.mark.django_db
def test_a_new_chat_asks_the_model_for_its_title_and_a_rename_wins(user, settings):
    settings.SLUICE_TITLES = True
    submitted = turns.conversation_start(user=user, text="what is a sluice gate?")
    conversation = Conversation.objects.get(id=submitted.conversation_id)
    asked = [
        json.loads(get_redis().hget(key, "purpose") or "{}")
        for key in get_redis().scan_iter(match=keys().request("*"))
    ]
    purpose = {
        "task": "title",
        "conversation": conversation.id,
        "provisional": "What is a sluice gate",
        "wait_s": suggestions.TITLE_WAIT_SECONDS,  # waits this long for a quiet line, then dropped
    }
    assert purpose in asked

    # The model's title replaces the first name, and the user's tabs hear of it.
    assert suggestions.title_finished(purpose=purpose, answer_text="Sluice gates")
    conversation.refresh_from_db()
    assert conversation.title == "Sluice gates"
    assert _chat_events("title")[-1]["title"] == "Sluice gates"
    # A title that comes back after the user renamed the chat is dropped.
    conversation.title = "Mine"
    conversation.save()
    assert not suggestions.title_finished(purpose=purpose, answer_text="Something else")
    conversation.refresh_from_db()
    assert conversation.title == "Mine"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_real_model_names_a_new_chat(user, settings, start_worker, dispatcher):
    settings.SLUICE_TITLES = True
    settings.MODEL_MAX_TOKENS = 24
    start_worker("titles-worker")
    submitted = turns.conversation_start(user=user, text="What is the capital of France?")
    first = Conversation.objects.get(id=submitted.conversation_id).title

    def named():
        title = Conversation.objects.get(id=submitted.conversation_id).title
        return title if title != first else None

    title = wait_until(named, timeout=240, what="the model's title")
    assert 0 < len(title) <= suggestions.TITLE_MAX and "\n" not in title


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
async def test_bad_edits_get_clear_errors(user, other_user):
    mine = await sync_to_async(conversation_create)(owner=user)
    theirs = await sync_to_async(conversation_create)(owner=other_user)
    foreign = await sync_to_async(message_create)(conversation=theirs, role="user", text="x")
    async with chat_socket(user, mine.id) as (ws, ok, _):
        assert ok
        for frame, error in [
            ({"type": "edit", "message_id": "1", "text": "x"}, "That edit could not be read."),
            (
                {"type": "edit", "message_id": foreign.id, "text": "x"},
                "That message was not found.",
            ),
            ({"type": "edit", "message_id": foreign.id, "text": " "}, "Type a message first."),
        ]:
            await ws.send_to(text_data=json.dumps(frame))
            assert (await _next(ws, "error"))["message"] == error
    assert await sync_to_async(lambda: theirs.messages.get().text)() == "x"


@pytest.mark.django_db
def test_a_question_from_the_rest_api_reaches_the_users_tabs_and_refusals_read_alike(
    user, client_for
):
    """Every way in tells the user's other tabs of a question (here the REST API, which once
    told them nothing), and a refused question reads the same on every way in."""
    conversation = conversation_create(owner=user)
    response = client_for(user).post(
        "/api/v1/requests",
        {"text": "Why is the sky blue?", "conversation": conversation.id},
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    [event] = _chat_events("question")
    assert event["request_id"] == response.json()["request_id"]
    assert event["text"] == "Why is the sky blue?"
    assert event["conversation"] == str(conversation.id)

    busy = client_for(user).post(
        "/api/v1/requests",
        {"text": "And at night?", "conversation": conversation.id},
        content_type="application/json",
    )
    assert busy.status_code == 409
    assert (
        busy.json()["error"]
        == submission.refusal_of(
            ConversationBusy("Wait for the current answer to finish, or stop it.")
        ).message
    )
    assert submission.refusal_of(submission.QueueUnavailable()).draft_kept
    assert submission.refusal_of(ValidationError("Too long.")).status == 400
    assert len(_chat_events("question")) == 1  # the refused question told nobody

    started = client_for(user).post(
        "/api/v1/requests", {"text": "A new topic"}, content_type="application/json"
    )
    assert started.status_code == 202, started.content
    first, second = _chat_events("question")
    assert not first.get("new")
    assert second["new"] and second["conversation"] == str(started.json()["conversation"])
