"""Background requests: they queue behind people's requests in the real dispatcher, and their
answers go to their task (follow-up chips in the inbox, tag proposals that wait for a yes)
instead of becoming chat messages."""

from __future__ import annotations

import pytest

from apps.accounts.models import Profile, Tag, TagProposal
from apps.chat import background
from apps.chat.models import Message
from apps.chat.prompt import memory_writer
from apps.chat.recorder import ensure_group, record_pending
from apps.chat.services import conversation_create, message_create
from apps.inbox.models import InboxMessage
from contract.protocol import Answer, State, WorkItem
from core.redis_client import get_redis, keys
from tests.admission.conftest import (  # noqa: F401  (fixtures)
    admission,
    clock,
    give_the_fleet_slots,
    make_dispatcher,
    publish,
    state,
    work_item_ids,
    worker_answers,
)

pytestmark = pytest.mark.django_db


def finish(request_id: str, user_id: int, text: str, *, conversation_id: str = "") -> None:
    """The answer record a worker leaves, then one recorder pass."""
    get_redis().xadd(
        keys().done,
        Answer(
            id=request_id,
            user_id=str(user_id),
            conversation_id=conversation_id,
            state=State.DONE,
            text=text,
        ).to_fields(),
    )
    ensure_group()
    record_pending(consumer="test", block_ms=None)


def background_items(task: str) -> list[WorkItem]:
    items = [WorkItem.from_fields(f) for _, f in get_redis().xrange(keys().admit)]
    return [i for i in items if i.kind == "background" and i.purpose.get("task") == task]


def test_a_background_request_never_runs_ahead_of_a_persons(make_dispatcher, user):  # noqa: F811
    # Sluice's own request comes first, then the person's; one free slot goes to the person.
    own = background.background_submit(
        user_id=user.id,
        purpose={"task": "test"},
        messages=[{"role": "user", "content": "Notes?"}],
        max_tokens=16,
    )
    person = publish(user.id)
    give_the_fleet_slots(1)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert state(person) == "dispatched"
    assert state(own) == "queued"
    assert own not in work_item_ids(keys().work)
    # Once the person's answer is done the slot is free, and the background request runs.
    worker_answers(person)
    give_the_fleet_slots(1)
    dispatcher.step()
    dispatcher.step()
    assert state(own) == "dispatched"


def test_an_answer_asks_for_follow_ups_and_they_reach_the_inbox(user, settings):
    settings.SLUICE_FOLLOWUPS = True
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="What is a sluice gate?")
    finish(
        "answer-1",
        user.id,
        "A gate that controls water flow.",
        conversation_id=str(conversation.id),
    )
    answer = Message.objects.get(request_id="answer-1")
    [ask] = background_items("followups")
    assert ask.conversation_id == "" and ask.purpose["request"] == "answer-1"
    assert "What is a sluice gate?" in ask.messages[-1]["content"]

    suggested = (
        "1. How deep is a sluice?\n2. Who invented the sluice gate?\n"
        "3. What is a sluice gate?\n- Are sluice gates dangerous for fish?\n5. Why?"
    )
    finish(ask.id, user.id, suggested)
    [note] = InboxMessage.objects.filter(user=user, kind=InboxMessage.Kind.FOLLOWUPS)
    assert note.data["questions"] == [  # the question itself is not suggested back
        "How deep is a sluice?",
        "Who invented the sluice gate?",
        "Are sluice gates dangerous for fish?",
    ]
    assert note.data["message_id"] == answer.id
    assert note.data["conversation_id"] == conversation.id
    # The suggestions are not a chat message.
    assert list(conversation.messages.values_list("request_id", flat=True)) == [None, "answer-1"]


def test_follow_ups_are_not_asked_when_turned_off(user, settings):
    settings.SLUICE_FOLLOWUPS = False
    conversation = conversation_create(owner=user)
    finish("answer-1", user.id, "Hi.", conversation_id=str(conversation.id))
    assert background_items("followups") == []


def test_an_answer_with_nothing_to_ask_after_it_reads_nothing(
    user, settings, django_assert_num_queries
):
    """Follow-ups and tag proposals off and no model writing memory: the recorder's work after
    an answer costs no statement (its conversation is read only when something is asked)."""
    settings.SLUICE_FOLLOWUPS = False
    settings.SLUICE_TAG_PROPOSAL_EVERY = 0
    conversation = conversation_create(owner=user)
    answer = Answer(
        id="answer-1",
        user_id=str(user.id),
        conversation_id=str(conversation.id),
        state=State.DONE,
        text="Hi.",
    )
    memory_writer.writers_forget()
    background.answers_recorded([answer], requests=[{}])  # reads who writes memory, once
    with django_assert_num_queries(0):
        background.answers_recorded([answer], requests=[{}])
    assert background_items("followups") == []


def test_proposed_tags_need_the_users_yes(user, other_user, client_for, settings):
    settings.SLUICE_TAG_PROPOSAL_EVERY = 2
    gardener = Tag.objects.create(name="Gardener", slug="gardener", prompt_hint="Grows plants.")
    Tag.objects.create(name="Astronomer", slug="astronomer", prompt_hint="Watches stars.")
    conversation = conversation_create(owner=user)
    for question in ("How do I prune roses?", "When should I plant tomatoes?"):
        message_create(conversation=conversation, role="user", text=question)
    finish("answer-2", user.id, "In spring.", conversation_id=str(conversation.id))
    [ask] = background_items("tags")  # after every second question
    assert "prune roses" in ask.messages[-1]["content"]

    finish(ask.id, user.id, "Gardener\nChef")  # a tag the admin never defined is ignored
    [proposal] = TagProposal.objects.filter(user=user)
    assert proposal.tag == gardener and proposal.status == "proposed"
    assert not Profile.objects.get(user=user).tags.exists()  # nothing applied without a yes

    page = client_for(user).get("/accounts/profile/").content.decode()
    assert "Suggested tags" in page and "Gardener" in page
    url = f"/accounts/profile/tags/{proposal.id}/"
    assert client_for(other_user).post(url, {"decision": "accept"}).status_code == 404
    client_for(user).post(url, {"decision": "accept"})
    assert list(Profile.objects.get(user=user).tags.all()) == [gardener]
    proposal.refresh_from_db()
    assert proposal.status == "accepted" and proposal.decided is not None
    assert client_for(user).post(url, {"decision": "reject"}).status_code == 404  # decided


def test_a_rejected_tag_is_not_applied_nor_proposed_again(user, client_for):
    tag = Tag.objects.create(name="Gardener", slug="gardener")
    proposal = TagProposal.objects.create(user=user, tag=tag)
    client_for(user).post(f"/accounts/profile/tags/{proposal.id}/", {"decision": "reject"})
    assert not Profile.objects.get(user=user).tags.exists()
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="How do I grow basil?")
    assert background.tags_schedule(user_id=user.id) is None  # no tag left to propose


def test_admins_see_how_proposed_tags_were_taken_up(user, other_user, client_for):
    from apps.accounts.services import user_create

    tag = Tag.objects.create(name="Gardener", slug="gardener")
    TagProposal.objects.create(user=user, tag=tag, status="accepted")
    TagProposal.objects.create(user=other_user, tag=tag, status="rejected")
    admin = user_create(username="root", password="correct-horse-battery", is_staff=True)
    page = client_for(admin).get("/admin/accounts/tag/").content.decode()
    for column in ("proposed", "accepted", "rejected"):
        assert f"column-{column}" in page
    assert '<td class="field-proposed">2</td>' in page
    assert '<td class="field-accepted">1</td>' in page
