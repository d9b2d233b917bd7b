"""The recorder counts every answer's usage once, in the transaction that stores the answer,
and the hourly sums always equal the per-request rows they were made from."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Count, Sum
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from apps.accounts.services import api_key_create, api_key_hash
from apps.admission.models import Plan, UserPlan
from apps.chat import recorder
from apps.chat.models import Message
from apps.chat.services import conversation_create, message_create
from apps.usage.models import HourlyUsage, RequestUsage
from contract.protocol import Answer, State, Usage
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db

SUMS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "wall_ms")


def answer(conversation, request_id: str, **extra) -> Answer:
    fields = {
        "id": request_id,
        "user_id": str(conversation.owner_id),
        "conversation_id": str(conversation.id),
        "state": State.DONE,
        "text": "Blue.",
        "usage": Usage(prompt_tokens=40, completion_tokens=5, cached_tokens=32),
        "model": "smollm2",
    }
    return Answer(**(fields | extra))


def deliver(*answers: Answer) -> int:
    recorder.ensure_group()
    for a in answers:
        get_redis().xadd(keys().done, a.to_fields())
    return recorder.record_pending(consumer="c1", block_ms=10)


def rollups_match_rows() -> None:
    rows = RequestUsage.objects.aggregate(
        requests=Count("id"), **{name: Sum(name) for name in SUMS[1:]}
    )
    sums = HourlyUsage.objects.aggregate(**{name: Sum(name) for name in SUMS})
    assert {k: v or 0 for k, v in rows.items()} == {k: v or 0 for k, v in sums.items()}


def test_an_answer_is_counted_once_however_often_it_is_delivered(user):
    conversation = conversation_create(owner=user)
    a = answer(conversation, "r1")
    assert deliver(a, a, a) == 3
    row = RequestUsage.objects.get(request_id="r1")
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (40, 32, 5)
    assert (row.model, row.kind, row.outcome, row.user_id) == ("smollm2", "chat", "done", user.pk)
    assert row.plan_id == Plan.objects.get(is_default=True).pk
    hour = HourlyUsage.objects.get()
    assert (hour.requests, hour.prompt_tokens, hour.completion_tokens) == (1, 40, 5)
    deliver(a)  # a later redelivery, in a batch of its own
    assert HourlyUsage.objects.get().requests == 1


def test_usage_goes_in_the_transaction_that_stores_the_answers(user):
    conversation = conversation_create(owner=user)
    with CaptureQueriesContext(connection) as queries:
        deliver(answer(conversation, "a"), answer(conversation, "b"))
    statements = [q["sql"] for q in queries if "usage_requestusage" in q["sql"]]
    assert len(statements) == 1  # the whole batch's rows and sums in one statement
    assert Message.objects.filter(request_id__in=["a", "b"]).count() == 2
    assert RequestUsage.objects.count() == 2
    rollups_match_rows()


def test_an_answer_stored_before_its_record_is_not_inserted_twice_and_counted_once(user):
    """A web process of the previous release stored answers itself during a rolling upgrade."""
    conversation = conversation_create(owner=user)
    a = answer(conversation, "web")
    message_create(conversation=conversation, role="assistant", text="Hi", request_id="web")
    get_redis().hset(keys().request("web"), mapping={"kind": "rag", "stored": "1"})
    deliver(a)
    deliver(a)
    assert Message.objects.filter(request_id="web").count() == 1
    assert RequestUsage.objects.get(request_id="web").kind == "rag"


def test_api_requests_are_filed_under_their_key_and_plan(user):
    key, raw = api_key_create(user=user, name="script")
    premium = Plan.objects.create(slug="premium", name="Premium")
    UserPlan.objects.create(user=user, plan=premium)
    get_redis().hset(keys().request("api1"), mapping={"kind": "api", "api_key": api_key_hash(raw)})
    deliver(
        Answer(
            id="api1",
            user_id=str(user.pk),
            conversation_id="",
            state=State.DONE,
            text="Hi.",
            usage=Usage(prompt_tokens=7, completion_tokens=2),
            model="smollm2",
        )
    )
    row = RequestUsage.objects.get(request_id="api1")
    assert (row.api_key_id, row.plan_id, row.kind, row.conversation_id) == (
        key.pk,
        premium.pk,
        "api",
        0,
    )


def test_refusals_cancellations_and_failures_keep_their_outcome(user):
    conversation = conversation_create(owner=user)
    deliver(
        answer(conversation, "no", state=State.FAILED, text="", code="rate_limited", usage=Usage()),
        answer(conversation, "stop", state=State.CANCELLED, text=""),
        answer(conversation, "bad", state=State.FAILED, text="", error="The model failed"),
    )
    outcomes = dict(RequestUsage.objects.values_list("request_id", "outcome"))
    assert outcomes == {"no": "rejected", "stop": "cancelled", "bad": "failed"}
    assert RequestUsage.objects.get(request_id="no").reason == "rate_limited"
    rollups_match_rows()


def test_an_answer_whose_figures_are_out_of_range_still_counts_what_it_can(user):
    conversation = conversation_create(owner=user)
    bad = answer(conversation, "neg", usage=Usage(prompt_tokens=-1, completion_tokens=3))
    deliver(bad, answer(conversation, "ok"))
    assert RequestUsage.objects.get(request_id="neg").prompt_tokens == 0
    assert Message.objects.filter(request_id="ok").exists()
    rollups_match_rows()


records = st.lists(
    st.tuples(
        st.integers(0, 11),  # request number: repeats are redeliveries
        st.sampled_from([State.DONE, State.CANCELLED, State.FAILED]),
        st.integers(0, 5000),
        st.integers(0, 800),
        st.booleans(),  # the web stored it first (the next question came before the recorder)
        st.booleans(),  # an API request (no conversation)
    ),
    min_size=1,
    max_size=30,
)


@hsettings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=records, batch=st.integers(1, 8), crash_after=st.integers(0, 3))
def test_hourly_sums_always_equal_the_rows(user, records, batch, crash_after):
    RequestUsage.objects.all().delete()
    HourlyUsage.objects.all().delete()
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    client = get_redis()
    client.delete(keys().done)
    client.xgroup_create(keys().done, "recorder", id="0", mkstream=True)
    seen = set()
    for number, state, prompt, completion, web_stored, api in records:
        request_id = f"p{conversation.id}-{number}"
        seen.add(request_id)
        if web_stored and not api:  # by a web process of the previous release
            message_create(
                conversation=conversation, role="assistant", text="Hi", request_id=request_id
            )
        a = answer(
            conversation,
            request_id,
            state=state,
            conversation_id="" if api else str(conversation.id),
            usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
        )
        client.xadd(keys().done, a.to_fields())
    # A dispatcher that read a few batches and died before acknowledging them: its successor
    # (another consumer name) claims and stores them again.
    for _ in range(crash_after):
        client.xreadgroup("recorder", "dead", {keys().done: ">"}, count=batch)
    pending = client.xpending_range(keys().done, "recorder", "-", "+", 1000)
    if pending:
        client.xclaim(keys().done, "recorder", "standby", 0, [p["message_id"] for p in pending])
    while recorder.record_pending(consumer="standby", block_ms=None, count=batch):
        pass
    assert RequestUsage.objects.count() == len(seen)
    rollups_match_rows()
