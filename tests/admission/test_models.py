"""A fleet of models, as the dispatcher sees it: each model's work goes to its own stream as its
own workers free slots, a full model holds back only its own line, a request that names no
model runs on the default one, a plan's models are enforced, and a stateless API request (no
conversation) is admitted, settled and never stored as a message."""

from __future__ import annotations

import json
import time

import pytest

from apps.admission.models import Plan
from apps.chat.models import Message
from apps.chat.submission import request_publish
from contract import transitions
from contract.protocol import Answer, State, Usage, WorkItem, new_request_id
from core.redis_client import get_redis
from tests.admission.conftest import final, keys, publish, roomy_plan, state, work_item_ids

pytestmark = pytest.mark.django_db


def serve(worker_id: str, model: str, slots: int, *, busy: int = 0) -> None:
    """A live worker serving `model`, as its heartbeat tells the dispatcher."""
    beat = {
        "worker_id": worker_id,
        "model": model,
        "slots": slots,
        "busy": busy,
        "healthy": True,
        "running": [],
    }
    client = get_redis()
    client.set(keys().heartbeat(worker_id), json.dumps(beat), ex=60)
    client.zadd(keys().workers, {worker_id: time.time()})


def ask(user_id, model: str = "", *, conversation: str = "999999", kind: str = "chat") -> str:
    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id=conversation,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=16,
        temperature=0.0,
        prompt_tokens_estimate=10,
        kind=kind,
        model=model,
    )
    request_publish(item=item)
    return item.id


def model_of(stream: str, request_id: str) -> str:
    return next(f.get("model", "") for _, f in get_redis().xrange(stream) if f["id"] == request_id)


def test_each_models_work_goes_to_its_own_stream(make_dispatcher, user):
    roomy_plan()
    serve("wa", "alpha", 2)
    serve("wb", "beta", 2)
    a, b = ask(user.id, "alpha"), ask(user.id, "beta")
    make_dispatcher().step()
    assert work_item_ids(keys().work_for_model("alpha")) == [a]
    assert work_item_ids(keys().work_for_model("beta")) == [b]
    assert work_item_ids(keys().work) == []


def test_a_full_model_holds_back_only_its_own_line(make_dispatcher, user, other_user):
    roomy_plan(max_concurrent=10)
    serve("wa", "alpha", 1)
    serve("wb", "beta", 2)
    dispatcher = make_dispatcher()
    first = ask(user.id, "alpha")
    dispatcher.step()
    # alpha's one slot is taken; the next alpha request waits, beta's go out past it.
    waiting = ask(user.id, "alpha")
    others = [ask(user.id, "beta"), ask(other_user.id, "beta")]
    dispatcher.step()
    dispatcher.step()
    assert work_item_ids(keys().work_for_model("alpha")) == [first]
    assert state(waiting) == "queued"
    assert sorted(work_item_ids(keys().work_for_model("beta"))) == sorted(others)


def test_positions_count_the_requests_ahead_for_the_same_model(make_dispatcher, user, other_user):
    roomy_plan(max_concurrent=10)
    serve("wa", "alpha", 1, busy=1)
    serve("wb", "beta", 1, busy=1)
    get_redis().xadd(keys().work_for_model("alpha"), {"id": "running-a"})  # both are full
    get_redis().xadd(keys().work_for_model("beta"), {"id": "running-b"})
    dispatcher = make_dispatcher()
    alphas = [ask(user.id, "alpha"), ask(user.id, "alpha")]
    beta = ask(other_user.id, "beta")
    dispatcher.step()
    told = {}
    for request_id in [*alphas, beta]:
        positions = [
            e for _, e in get_redis().xrange(keys().output(request_id)) if e.get("position")
        ]
        told[request_id] = positions[-1]["position"]
    assert [told[a] for a in alphas] == ["1", "2"]
    assert told[beta] == "1"  # alpha's line is not ahead of it


def test_a_request_naming_no_model_runs_on_the_default_one(make_dispatcher, user, settings):
    roomy_plan()
    serve("wb", "beta", 2)
    serve("wa", "alpha", 2)
    dispatcher = make_dispatcher()
    first = ask(user.id)
    dispatcher.step()
    assert model_of(keys().work_for_model("alpha"), first) == "alpha"  # the first by name
    settings.SLUICE_DEFAULT_MODEL = "beta"
    second = ask(user.id)
    dispatcher.step()
    assert model_of(keys().work_for_model("beta"), second) == "beta"


def test_a_model_the_plan_does_not_list_is_refused(make_dispatcher, user):
    roomy_plan(model_names=["alpha"])
    serve("wa", "alpha", 2)
    serve("wb", "beta", 2)
    dispatcher = make_dispatcher()
    allowed, refused, defaulted = ask(user.id, "alpha"), ask(user.id, "beta"), ask(user.id)
    dispatcher.step()
    assert final(refused)["state"] == "failed"
    assert final(refused)["code"] == "model_not_allowed"
    assert "beta" in final(refused)["error"]
    assert sorted(work_item_ids(keys().work_for_model("alpha"))) == sorted([allowed, defaulted])
    assert Plan.objects.get(slug="free").allows("alpha")


def test_an_api_request_without_a_conversation_is_settled_and_never_stored(make_dispatcher, user):
    roomy_plan(max_concurrent=1)
    serve("wa", "alpha", 4)
    dispatcher = make_dispatcher()
    first = ask(user.id, "alpha", conversation="", kind="api")
    second = ask(user.id, "alpha", conversation="", kind="api")
    dispatcher.step()
    assert state(first) == "dispatched"
    assert state(second) == "queued"  # the plan allows one at a time
    client, k, token = get_redis(), keys(), "t1"
    pipe = client.pipeline(transaction=False)
    transitions.start(pipe, k, first, token=token, worker_id="wa")
    transitions.finish(
        pipe,
        k,
        Answer(
            id=first,
            user_id=str(user.id),
            conversation_id="",
            state=State.DONE,
            text="Hi.",
            worker_id="wa",
            usage=Usage(prompt_tokens=5, completion_tokens=2),
        ),
        token=token,
    )
    pipe.execute()
    done = Answer.from_fields(
        {**final(first), "id": first, "user_id": str(user.id), "conversation_id": ""}
    )
    client.xadd(k.done, done.to_fields())
    dispatcher.step()  # the recorder's pass settles it: the plan's one place is free again
    dispatcher.step()
    assert state(second) == "dispatched"
    assert not Message.objects.exists()
    assert client.hlen(k.charges) == 1  # only the second's charge is still open


def test_a_chat_request_still_needs_its_conversation(make_dispatcher, user):
    roomy_plan()
    serve("wa", "alpha", 2)
    broken = publish(user.id, conversation="")
    make_dispatcher().step()
    assert get_redis().xlen(keys().dead) == 1
    assert state(broken) == "failed"


def test_an_admin_lists_a_plans_models_and_sees_which_are_served(client_for, user):
    user.is_staff = user.is_superuser = True
    user.save()
    admin = client_for(user)
    serve("wa", "alpha", 2)
    plan = roomy_plan()
    page = admin.get(f"/admin/admission/plan/{plan.pk}/change/").content.decode()
    assert "alpha (2 slots, plain sampling only)" in page  # what the workers serve now
    form = dict(
        name=plan.name,
        slug=plan.slug,
        is_default="on",
        requests_per_minute=30,
        burst_requests=10,
        tokens_per_minute=30000,
        burst_tokens=30000,
        tokens_per_day=900000,
        max_concurrent=2,
        max_background_concurrent=1,
        max_queue_wait_seconds=60,
        max_tokens_cap=512,
        priority_weight=1,
        cost_weights='{"chat": 1}',
        long_prompt_tokens=1500,
        model_names="alpha, all-MiniLM-L6-v2",
    )
    response = admin.post(f"/admin/admission/plan/{plan.pk}/change/", form)
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.model_names == ["alpha", "all-MiniLM-L6-v2"]
    assert plan.allows("alpha") and not plan.allows("beta")
