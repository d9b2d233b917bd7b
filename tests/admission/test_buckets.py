"""The bucket script against a pure-Python model, under concurrency, and its keys' lifetimes."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pytest
from django.conf import settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from apps.admission.buckets import (
    BACKGROUND_FROM,
    NEVER,
    TAKEN,
    WAIT,
    Bucket,
    BucketStore,
    plan_buckets,
)
from contract.protocol import Keys
from core.redis_client import get_redis
from tests.admission.bucket_model import BucketModel
from tests.conftest import BASE_DIR, process_env

bucket_shapes = st.lists(
    st.tuples(
        st.integers(1, 50),  # capacity
        st.integers(1, 600),  # refill per window
        st.sampled_from([1000, 60_000, 86_400_000]),  # window ms
    ),
    min_size=1,
    max_size=3,
)
operations = st.lists(
    st.tuples(
        st.sampled_from(["take", "take", "adjust"]),
        st.integers(0, 120_000),  # ms elapsed before the operation
        st.integers(0, 3),  # which user key
        st.floats(-20, 60).map(lambda x: round(x, 2)),  # amount (negative: a charge via adjust)
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.django_db
@hsettings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shapes=bucket_shapes, ops=operations, start=st.integers(1_600_000_000_000, 1_900_000_000_000)
)
def test_script_matches_the_reference_model(redis_prefix, shapes, ops, start):
    store = BucketStore(get_redis())
    model = BucketModel()
    run = uuid.uuid4().hex[:8]  # each example its own keys
    keys = [Keys(prefix=redis_prefix).bucket(f"{run}-{i}") for i in range(4)]
    now = start
    for mode, elapsed, user, amount in ops:
        now += elapsed
        if mode == "take":
            amount = abs(amount)
        buckets = [
            Bucket(f"b{i}", cap, refill, window, amount)
            for i, (cap, refill, window) in enumerate(shapes)
        ]
        request = [(keys[user], buckets)]
        expected = model.run(mode, [(keys[user], [b.scaled() for b in buckets])], now)
        if mode == "take":
            got = store.take(request, now_ms=now)
            assert [(d.code, d.wait_ms) for d in got] == [(c, w) for c, w, _ in expected]
        else:
            store.adjust(request, now_ms=now)
    for key in keys:
        stored = get_redis().hgetall(key)
        for name, (level, t, _, _) in model.state.get(key, {}).items():
            assert int(stored[f"{name}:l"]) == level
            assert int(stored[f"{name}:t"]) == t
        assert_outlives_its_buckets(key, model, now)


def assert_outlives_its_buckets(key: str, model: BucketModel, now: int) -> None:
    """The key (whose levels match the model's) lives until its last bucket is full again:
    expiring earlier would hand back what its buckets still owe."""
    if key in model.state:
        ttl = get_redis().pttl(key)
        assert ttl > 0
        assert now + ttl >= model.full_at(key)


limits = st.builds(
    SimpleNamespace,
    burst_requests=st.integers(1, 20),
    requests_per_minute=st.integers(1, 600),
    burst_tokens=st.integers(100, 5000),
    tokens_per_minute=st.integers(100, 100_000),
    tokens_per_day=st.integers(5000, 1_000_000),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 30_000), st.integers(1, 2000)),
        st.tuples(st.just("refund"), st.integers(0, 30_000), st.integers(1, 2000)),
        st.tuples(st.just("burst"), st.integers(0, 30_000), st.integers(1, 12)),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.django_db
@hsettings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=limits, sequence=steps, start=st.integers(1_600_000_000_000, 1_900_000_000_000))
def test_reserve_refund_burst_matches_the_model_and_no_bucket_state_expires_early(
    redis_prefix, plan, sequence, start
):
    # As the dispatcher drives them: a reservation charges all three buckets, a refund (an
    # answer that used less than its estimate) only the token buckets, a burst many at once.
    store = BucketStore(get_redis())
    model = BucketModel()
    key = Keys(prefix=redis_prefix).bucket(uuid.uuid4().hex[:8])
    now = start
    for action, elapsed, amount in sequence:
        now += elapsed
        if action == "refund":
            buckets = [b for b in plan_buckets(plan, tokens=amount, requests=0) if b.name != "req"]
            store.adjust([(key, buckets)], now_ms=now)
            model.run("adjust", [(key, [b.scaled() for b in buckets])], now)
        else:
            buckets = plan_buckets(plan, tokens=amount if action == "reserve" else 50)
            requests = [(key, buckets)] * (1 if action == "reserve" else amount)
            got = store.take(requests, now_ms=now)
            expected = model.run("take", [(k, [b.scaled() for b in bs]) for k, bs in requests], now)
            assert [(d.code, d.wait_ms) for d in got] == [(c, w) for c, w, _ in expected]
        assert_outlives_its_buckets(key, model, now)


def test_a_refund_does_not_give_the_request_burst_back(redis_prefix):
    # As reported: 60 requests a minute, a burst of 10. The day's token bucket kept the key for
    # about a quarter of an hour; one refund cut that to a second, the request bucket's state
    # expired with the key, and 10 of the next 12 requests went through where 1 was allowed.
    plan = SimpleNamespace(
        burst_requests=10,
        requests_per_minute=60,
        burst_tokens=20_000,
        tokens_per_minute=20_000,
        tokens_per_day=500_000,
    )
    client = get_redis()
    store = BucketStore(client)
    key = Keys(prefix=redis_prefix).bucket("reported")
    drained_at = client.time()
    assert all(d.taken for d in store.take([(key, plan_buckets(plan, tokens=530))] * 10))
    assert client.pttl(key) > 900_000
    refund = [b for b in plan_buckets(plan, tokens=530, requests=0) if b.name != "req"]
    store.adjust([(key, refund)] * 10)  # the answers used nothing
    assert client.pttl(key) > 9_000  # the request bucket needs 10 s to fill again
    time.sleep(1.1)  # past the one-second lifetime the refund used to leave
    taken = sum(d.taken for d in store.take([(key, plan_buckets(plan, tokens=530))] * 12))
    now = client.time()
    elapsed = (now[0] - drained_at[0]) + (now[1] - drained_at[1]) / 1e6
    assert taken <= 1 + int(elapsed)  # one request a second since the burst was spent


@pytest.mark.django_db
@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shapes=bucket_shapes,
    picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=30),
    now=st.integers(1_600_000_000_000, 1_900_000_000_000),
)
def test_a_batch_of_requests_sharing_bucket_lists_matches_the_model(
    redis_prefix, shapes, picks, now
):
    # As the dispatcher sends a batch: one list object per plan and size, so consecutive
    # requests of the same size go as "the same buckets again".
    store = BucketStore(get_redis())
    run = uuid.uuid4().hex[:8]
    keys = [Keys(prefix=redis_prefix).bucket(f"{run}-{i}") for i in range(4)]
    sizes = [
        [
            Bucket(f"b{i}", cap, refill, window, amount)
            for i, (cap, refill, window) in enumerate(shapes)
        ]
        for amount in (1, 7, 30)
    ]
    requests = [(keys[user], sizes[size]) for user, size in picks]
    expected = BucketModel().run(
        "take", [(key, [b.scaled() for b in buckets]) for key, buckets in requests], now
    )
    got = store.take(requests, now_ms=now)
    assert [(d.code, d.wait_ms) for d in got] == [(c, w) for c, w, _ in expected]


def test_codes_and_batches(redis_prefix):
    store = BucketStore(get_redis())
    key = Keys(prefix=redis_prefix).bucket("u1")
    two = [Bucket("req", 2, 60, 60_000, 1)]
    decisions = store.take([(key, two)] * 3, now_ms=1_000_000)
    assert [d.code for d in decisions] == [TAKEN, TAKEN, WAIT]
    assert decisions[2].wait_ms == 1000 and decisions[2].bucket == "req"
    assert store.take([(key, [Bucket("req", 2, 60, 60_000, 3)])], now_ms=1_000_000)[0].code == NEVER
    # After a second one request has refilled.
    assert store.take([(key, two)], now_ms=1_001_000)[0].code == TAKEN


@pytest.mark.parametrize("size", [1, BACKGROUND_FROM - 1, BACKGROUND_FROM, 3 * BACKGROUND_FROM])
def test_a_batch_decided_inline_or_on_the_helper_thread_gets_the_same_decisions(redis_prefix, size):
    store = BucketStore(get_redis())
    keys = Keys(prefix=redis_prefix)
    ten = [Bucket("req", 10, 60, 60_000, 1)]
    batch = [(keys.bucket(f"u{n % 3}"), ten) for n in range(size)]
    got = store.take_in_background(batch, now_ms=1_000_000).result()
    assert [d.code for d in got] == [TAKEN if n < 30 else WAIT for n in range(size)]
    # The same batch decided by the plain call, on fresh keys, from the same state.
    again = [(keys.bucket(f"v{n % 3}"), ten) for n in range(size)]
    assert store.take(again, now_ms=1_000_000) == got


@pytest.mark.slow
def test_processes_hammering_one_user_never_exceed_capacity_plus_refill(redis_prefix):
    client = get_redis()
    key = Keys(prefix=redis_prefix).bucket("hammered")
    seconds = 2.0
    started = client.time()
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.admission.hammer", settings.REDIS_URL, key, str(seconds)],
            cwd=BASE_DIR,
            env=process_env(redis_prefix),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    taken = sum(int(p.communicate(timeout=60)[0].strip()) for p in processes)
    ended = client.time()
    elapsed = (ended[0] - started[0]) + (ended[1] - started[1]) / 1e6
    # burst 20, then 10 per second (hammer.Limits)
    assert taken <= 20 + 10 * elapsed + 1
    assert taken >= 20  # the burst itself was admitted
