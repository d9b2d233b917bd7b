"""A fleet of models outside the OpenAI API: the chat page's model picker (only models a live
worker serves and the plan allows; the choice is kept per conversation and answers come from
it) and `/api/v1/requests` with `model`. Two simulated workers serve "alpha" (answers of 6
tokens) and "beta" (9 tokens), so the length of an answer says which model wrote it."""

from __future__ import annotations

import json

import httpx
import pytest
from asgiref.sync import sync_to_async

from apps.accounts.services import api_key_create
from apps.admission.models import Plan
from apps.admission.selectors import model_fleet
from apps.chat.models import Conversation, Message
from apps.chat.services import conversation_create
from tests.admission.conftest import force_level
from tests.chat.conftest import chat_socket, receive_until, wait_for
from tests.chat.test_openai_api import roomy, start_model, tokens
from tests.conftest import read_sse

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("close_thread_connections"),
]


@pytest.fixture
def models(transactional_db, dispatcher, start_worker, redis_prefix):
    force_level(0)  # this machine's own load must not cap or shed the tests' answers
    roomy()
    return {
        "alpha": start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6),
        "beta": start_model(start_worker, redis_prefix, "wb", "beta", tokens=9),
    }


def picker_options(page: str) -> list[str]:
    start = page.index('id="model-select"')
    select = page[start : page.index("</select>", start)]
    return [part.split('"', 1)[0] for part in select.split('<option value="')[1:]]


def test_the_picker_offers_the_live_models_the_plan_allows_and_keeps_the_choice(
    models, user, client_for
):
    browser = client_for(user)
    conversation = conversation_create(owner=user)
    page = browser.get(f"/c/{conversation.id}/").content.decode()
    assert picker_options(page) == ["", "alpha", "beta"]  # "": the default
    assert "Default (alpha)" in page

    browser.post(f"/c/{conversation.id}/model/", {"model": "beta"})
    conversation.refresh_from_db()
    assert conversation.model == "beta"
    page = browser.get(f"/c/{conversation.id}/").content.decode()
    assert '<option value="beta" selected>' in page

    Plan.objects.filter(slug="free").update(model_names=["alpha"])
    page = browser.get(f"/c/{conversation.id}/").content.decode()
    assert picker_options(page) == ["", "beta", "alpha"]  # beta is kept, shown as unavailable
    assert "beta (no worker now)" in page
    refused = browser.post(f"/c/{conversation.id}/model/", {"model": "beta"}, follow=True)
    assert "not available" in refused.content.decode()
    browser.post(f"/c/{conversation.id}/model/", {"model": ""})
    conversation.refresh_from_db()
    assert conversation.model == ""


async def test_the_conversations_model_answers_its_questions(models, user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    await sync_to_async(Conversation.objects.filter(pk=conversation.pk).update)(model="beta")
    async with chat_socket(user, conversation.id) as (ws, connected, _):
        assert connected
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Say hi."}))
        frames = await receive_until(ws, "final")
    assert frames[-1]["state"] == "done"
    assert frames[-1]["text"] == tokens(9)
    await wait_for(
        lambda: Message.objects.filter(role="assistant", text=tokens(9)).exists(),
        what="the answer stored",
    )

    models["beta"].kill()  # its only worker dies: the next question is refused at once
    await wait_for(lambda: "beta" not in model_fleet().live, what="beta to be gone")
    async with chat_socket(user, conversation.id) as (ws, _, _):
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Again."}))
        [error] = await receive_until(ws, "error")
    assert "No worker serves the model 'beta'" in error["message"]
    assert not await sync_to_async(Message.objects.filter(text="Again.").exists)()


def test_the_requests_api_takes_a_model_and_the_new_conversation_keeps_it(models, live_web, user):
    key = api_key_create(user=user, name="fleet")[1]
    with httpx.Client(
        base_url=live_web, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as api:
        created = api.post("/api/v1/requests", json={"text": "Say hi.", "model": "beta"})
        assert created.status_code == 202
        with api.stream("GET", created.json()["events_url"]) as events:
            final = read_sse(events)[-1]["data"]
        assert final["text"] == tokens(9)
        conversation = created.json()["conversation"]
        assert Conversation.objects.get(pk=conversation).model == "beta"
        # The next question in it, naming no model, is answered by the conversation's model.
        wait_for_free = api.post(
            "/api/v1/requests", json={"text": "Again.", "conversation": conversation}
        )
        while wait_for_free.status_code == 409:  # the answer is being recorded
            wait_for_free = api.post(
                "/api/v1/requests", json={"text": "Again.", "conversation": conversation}
            )
        assert wait_for_free.status_code == 202
        with api.stream("GET", wait_for_free.json()["events_url"]) as events:
            assert read_sse(events)[-1]["data"]["text"] == tokens(9)

        unknown = api.post("/api/v1/requests", json={"text": "Hi.", "model": "gamma"})
        assert unknown.status_code == 404 and "gamma" in unknown.json()["error"]
        assert api.post("/api/v1/requests", json={"text": "Hi.", "model": 7}).status_code == 400
