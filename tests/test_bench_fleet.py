"""bench/fleet.py's parts: the cache-aware balancer's load bound, the goodput search and the
seed intervals, and the model's dispatcher, which is the product's release pass."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import BASE_DIR

sys.path.insert(0, str(BASE_DIR / "bench"))

from fleet_balancers import Balancer
from fleet_stats import ratio_interval, search, verdict

WORKERS = {"a": 4.0, "b": 4.0, "c": 4.0}
SYSTEM = {"role": "system", "content": "You are the assistant of a water utility. " * 40}


def cache_aware(bound: int) -> Balancer:
    return Balancer("cache-aware", WORKERS, seed=1, cache_tokens=10_000, bound=bound)


def test_cache_aware_follows_the_prefix_until_its_worker_is_loaded_past_the_bound():
    balancer = cache_aware(bound=1)
    first = [SYSTEM, {"role": "user", "content": "How full is the reservoir?"}]
    idle = dict.fromkeys(WORKERS, 0)
    chosen = balancer.choose(key="c1", messages=first, load=idle)
    follow_up = [
        *first,
        {"role": "assistant", "content": "Half."},
        {"role": "user", "content": "And?"},
    ]
    one_more = {**idle, chosen: 1}  # within the bound: the prefix wins
    assert balancer.choose(key="c1", messages=follow_up, load=one_more) == chosen
    two_more = {**idle, chosen: 2}  # past it: the least loaded
    assert balancer.choose(key="c1", messages=follow_up, load=two_more) != chosen
    assert (balancer.by_cache, balancer.by_load) == (1, 2)  # the first held no prefix


def test_the_search_brackets_the_highest_rate_that_passes_and_halves_the_bracket():
    def simulate(rate: float) -> dict:  # passes up to 5 req/s
        p99 = 1000.0 if rate <= 5.0 else 9000.0
        return {"rate": rate, "ttft_p99": p99, "timed_out": 0, "dropped": 0, "rejected": 0}

    good, _ = search(simulate, 2.0, halvings=4)
    assert 5.0 / 1.2 ** (1 / 16) < good <= 5.0
    down, _ = search(simulate, 9.0, halvings=0)
    assert 5.0 / 1.2 < down <= 5.0


def test_a_ratio_whose_interval_holds_one_is_no_measurable_difference():
    even = ratio_interval([6.0, 5.5, 6.2, 5.8, 6.1], [5.9, 5.8, 6.0, 6.0, 5.9])
    assert even["t"][0] < 1.0 < even["t"][1]
    assert verdict(even["t"]) == "no measurable difference"
    ahead = ratio_interval([6.6, 6.5, 6.9, 6.4, 6.7], [5.9, 5.8, 6.0, 6.0, 5.9])
    assert verdict(ahead["t"]) == "faster" and ahead["boot"][0] > 1.0


@pytest.mark.django_db
def test_the_models_dispatcher_holds_a_user_to_the_plans_max_concurrent():
    from fleet_dispatch import Dispatch, model_plan
    from fleet_model import Fleet, Worker

    workers = [Worker(i, Fleet()) for i in range(2)]
    for worker in workers:
        worker.beat_at = 100.0
    sent = []
    dispatch = Dispatch(
        workers=workers,
        model="m",
        policy="affinity",
        max_load=1.0,
        read_s=0.5,
        plan=model_plan(max_concurrent=1),
        now=lambda: 100.0,
        dispatched=lambda stream, fields: sent.append((stream, fields["id"])),
    )
    messages = [SYSTEM, {"role": "user", "content": "How full is the reservoir?"}]
    for n, user in enumerate(("7", "7", "8")):
        dispatch.submit(
            job_id=f"r{n}", kind="chat", user=user, conversation=f"c{n}", messages=messages
        )
    assert dispatch.run(shared_waiting=0) == 2
    assert sorted(i for _, i in sent) == ["r0", "r2"]  # user 7's second waits its turn
    dispatch.settled("r0", worker_id="fw0", tokens=40, duration_s=2.0)
    assert dispatch.run(shared_waiting=0) == 1
    assert sent[-1][1] == "r1"
    assert json.loads(workers[0].heartbeat())["slots"] == 4
