"""The bucket script against a pure-Python model, under concurrency, and its keys' TTLs."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from apps.admission.buckets import NEVER, TAKEN, WAIT, Bucket, BucketStore
from apps.admission.keys import AdmissionKeys
from chatsite.redis_client import get_redis
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
    keys = [AdmissionKeys(redis_prefix).bucket(f"{run}-{i}") for i in range(4)]
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
        for name, (level, t) in model.state.get(key, {}).items():
            assert int(stored[f"{name}:l"]) == level
            assert int(stored[f"{name}:t"]) == t
        if key in model.state:
            assert 0 < get_redis().pttl(key) <= model.ttl_ms[key]


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
    keys = [AdmissionKeys(redis_prefix).bucket(f"{run}-{i}") for i in range(4)]
    sizes = [
        [Bucket(f"b{i}", cap, refill, window, amount) for i, (cap, refill, window) in
         enumerate(shapes)]
        for amount in (1, 7, 30)
    ]  # fmt: skip
    requests = [(keys[user], sizes[size]) for user, size in picks]
    expected = BucketModel().run(
        "take", [(key, [b.scaled() for b in buckets]) for key, buckets in requests], now
    )
    got = store.take(requests, now_ms=now)
    assert [(d.code, d.wait_ms) for d in got] == [(c, w) for c, w, _ in expected]


def test_codes_and_batches(redis_prefix):
    store = BucketStore(get_redis())
    key = AdmissionKeys(redis_prefix).bucket("u1")
    two = [Bucket("req", 2, 60, 60_000, 1)]
    decisions = store.take([(key, two)] * 3, now_ms=1_000_000)
    assert [d.code for d in decisions] == [TAKEN, TAKEN, WAIT]
    assert decisions[2].wait_ms == 1000 and decisions[2].bucket == "req"
    assert store.take([(key, [Bucket("req", 2, 60, 60_000, 3)])], now_ms=1_000_000)[0].code == NEVER
    # After a second one request has refilled.
    assert store.take([(key, two)], now_ms=1_001_000)[0].code == TAKEN


@pytest.mark.slow
def test_processes_hammering_one_user_never_exceed_capacity_plus_refill(redis_prefix):
    client = get_redis()
    key = AdmissionKeys(redis_prefix).bucket("hammered")
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
