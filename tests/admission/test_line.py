"""The line in Redis and its mirror: a reload restores the same line in the same order, and a
record that cannot be read is dead-lettered, its request ended, the rest of the line kept."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.admission.line import QueuedRequest
from core.redis_client import get_redis
from tests.admission.conftest import final, keys, publish, roomy_plan

text = st.text(max_size=20)
requests = st.builds(
    QueuedRequest,
    text,
    text,
    text,
    text,
    text,
    st.integers(0, 10**6),
    st.integers(1, 10**5),
    st.floats(0.01, 100),
    st.integers(0, 2**53),
    st.integers(0, 2**53),
    st.integers(0, 2**63),
    st.booleans(),
    st.integers(0, 2**53),
    st.sampled_from(["", "req", "tpm", "tpd"]),
    st.dictionaries(text, text, max_size=5),
)


@given(requests)
def test_a_queue_record_reads_back_as_it_was_written(request):
    assert QueuedRequest.decode(request.encode()) == request


def test_a_record_orjson_cannot_write_is_written_all_the_same():
    """Text with a lone surrogate (refused at every door, but a record must never stop the
    dispatcher) goes the standard library's way, and reads back."""
    odd = QueuedRequest(
        "r1",
        "7",
        "3",
        "chat",
        "free",
        10,
        100,
        1.0,
        1,
        2,
        3,
        True,
        0,
        "",
        {"messages": "hi \ud800"},
    )
    assert QueuedRequest.decode(odd.encode()) == odd
    assert json.loads(odd.charge_record())["user"] == "7"


@pytest.mark.django_db
def test_a_reload_restores_the_line_and_its_order(make_dispatcher, user, other_user):
    roomy_plan()
    for _ in range(5):
        publish(user.id)
        publish(other_user.id)
    first = make_dispatcher()
    first.step()
    again = make_dispatcher()
    again.load()
    assert again.line.order() == first.line.order()
    assert again.line.requests.keys() == first.line.requests.keys()


@pytest.mark.django_db
def test_an_unreadable_queue_record_ends_its_request_and_spares_the_rest(
    make_dispatcher, user, other_user
):
    broken, kept = publish(user.id), publish(other_user.id)
    make_dispatcher().step()
    get_redis().hset(keys().queue, broken, '{"seq": 1, "user": "alice"}')  # an older layout
    dispatcher = make_dispatcher()
    dispatcher.load()
    assert list(dispatcher.line.requests) == [kept]
    assert not get_redis().hexists(keys().queue, broken)
    dead = [fields for _, fields in get_redis().xrange(keys().dead)]
    assert [d["request_id"] for d in dead] == [broken]
    assert json.loads(dead[0]["fields"])["record"] == '{"seq": 1, "user": "alice"}'
    end = final(broken)
    assert end["state"] == "failed" and "could not read" in end["error"]
