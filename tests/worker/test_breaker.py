"""The circuit breaker, through a real worker process: answers that keep failing open it (the
heartbeat says so and the worker stops pulling), after the cool-down exactly one probe runs,
a failed probe opens it again, a good one closes it and the worker pulls as before. The
simulated engine's fault rate opens it too. The operations page and the worker's /metrics show
it open; the window's arithmetic, with a clock the test moves."""

from __future__ import annotations

import json
import time

import pytest

from contract import protocol, transitions
from contract.protocol import Keys, WorkItem
from core.redis_client import get_redis
from tests.conftest import wait_until

FAST = [
    "--sim-faults",
    "--sim-first-token-ms",
    "5",
    "--sim-decode-ms",
    "20",
    "--sim-tokens",
    "15",
    "--breaker-min-answers",
    "3",
    "--heartbeat-interval",
    "0.2",
]


def submit(keys: Keys, request_id: str, text: str) -> None:
    item = WorkItem(
        id=request_id,
        user_id="7",
        conversation_id="3",
        max_tokens=15,
        messages=[{"role": "user", "content": text}],
    )
    pipe = get_redis().pipeline(transaction=False)
    transitions.submitted(
        pipe, keys, item, citations=[], stream=keys.work, submit_by_ms=protocol.now_ms() + 5000
    )
    pipe.execute()


def breaker(keys: Keys, worker_id: str) -> dict:
    raw = get_redis().get(keys.heartbeat(worker_id))
    return (json.loads(raw).get("breaker") or {}) if raw else {}


def beat_after(keys: Keys, worker_id: str, after_ms: int) -> dict:
    """The worker's first heartbeat written at least two beats after `after_ms`: its loops have
    run since then, so what it has not done by now it chose not to do (not merely slow)."""

    def newer():
        raw = get_redis().get(keys.heartbeat(worker_id))
        beat = json.loads(raw) if raw else {}
        return beat if beat.get("at_ms", 0) > after_ms + 400 else None

    return wait_until(newer, timeout=20, what=f"a heartbeat of {worker_id} after {after_ms}")


def ended(keys: Keys, request_id: str) -> str | None:
    state = get_redis().hget(keys.request(request_id), "state")
    return state if state in ("done", "failed", "cancelled") else None


def event_ms(keys: Keys, request_id: str, kind: str) -> int:
    """When the request's first event of `kind` was written (its stream entry id's time)."""
    entry_id = next(i for i, f in get_redis().xrange(keys.output(request_id)) if f["type"] == kind)
    return int(entry_id.split("-")[0])


def test_failing_answers_open_the_breaker_a_probe_at_a_time_until_one_succeeds(
    start_worker, redis_prefix
):
    keys = Keys(prefix=redis_prefix)
    start_worker("wb", engine="simulated", slots=2, extra=[*FAST, "--breaker-cooldown", "3"])
    for n in range(3):
        submit(keys, f"bad{n}", "[[sim:fail]] please")
    wait_until(
        lambda: all(ended(keys, f"bad{n}") == "failed" for n in range(3)),
        timeout=60,
        what="three failed answers",
    )
    wait_until(
        lambda: breaker(keys, "wb").get("state") == "open", timeout=10, what="the breaker to open"
    )

    # Open: the worker pulls nothing, though it has two free slots.
    submitted_ms = protocol.now_ms()
    submit(keys, "probe-bad", "[[sim:fail]] again")
    assert beat_after(keys, "wb", submitted_ms)["breaker"]["state"] == "open"
    assert ended(keys, "probe-bad") is None
    assert get_redis().hget(keys.request("probe-bad"), "attempt") in (None, "0")

    # Half-open: one probe; it fails, so the breaker opens again and new work waits.
    wait_until(lambda: ended(keys, "probe-bad"), timeout=20, what="the first probe")
    wait_until(lambda: breaker(keys, "wb").get("opened") == 2, timeout=10, what="reopening")
    assert breaker(keys, "wb")["state"] == "open"
    submitted_ms = protocol.now_ms()
    submit(keys, "good1", "hello")
    submit(keys, "good2", "hello")
    assert beat_after(keys, "wb", submitted_ms)["breaker"]["state"] == "open"
    assert ended(keys, "good1") is None and ended(keys, "good2") is None

    # The next probe succeeds: closed, and only then does the second request start.
    wait_until(
        lambda: ended(keys, "good1") and ended(keys, "good2"), timeout=30, what="both good answers"
    )
    assert (ended(keys, "good1"), ended(keys, "good2")) == ("done", "done")
    assert event_ms(keys, "good2", "start") >= event_ms(keys, "good1", "final")
    wait_until(
        lambda: breaker(keys, "wb").get("state") == "closed",
        timeout=10,
        what="the breaker to close",
    )


def test_the_simulated_engines_fault_rate_opens_the_breaker(start_worker, redis_prefix):
    keys = Keys(prefix=redis_prefix)
    start_worker(
        "wf",
        engine="simulated",
        slots=4,
        extra=[*FAST, "--sim-fail-rate", "1", "--breaker-cooldown", "60"],
    )
    for n in range(6):
        submit(keys, f"r{n}", "hello")
    wait_until(
        lambda: breaker(keys, "wf").get("state") == "open", timeout=60, what="the breaker to open"
    )
    assert all(ended(keys, f"r{n}") in (None, "failed") for n in range(6))
    assert beat_after(keys, "wf", protocol.now_ms())["breaker"]["state"] == "open"
    # Whatever it had not read when it opened waits on the shared stream for another worker.
    waiting = [f["id"] for _, f in get_redis().xrange(keys.work)]
    assert waiting and all(ended(keys, r) is None for r in waiting)


@pytest.mark.django_db
def test_an_open_breaker_shows_on_the_ops_page_and_in_the_workers_metrics(redis_prefix):
    from apps.ops import dashboard
    from worker.metrics import BeatCollector

    beat = {
        "worker_id": "wo",
        "slots": 4,
        "busy": 0,
        "healthy": True,
        "at_ms": protocol.now_ms(),
        "breaker": {"state": "open", "error_rate": 0.4},
    }
    keys = Keys(prefix=redis_prefix)
    get_redis().set(keys.heartbeat("wo"), json.dumps(beat), ex=60)
    get_redis().zadd(keys.workers, {"wo": time.time()})
    assert [w.status for w in dashboard.gather().workers] == ["breaker-open"]
    gauges = {f.name: f.samples[0].value for f in BeatCollector(lambda: beat).collect()}
    assert gauges["sluice_worker_breaker_open"] == 1


def test_the_error_rate_is_over_the_window_and_needs_enough_answers():
    from worker.breaker import BreakerSettings, CircuitBreaker

    now = [0.0]
    breaker = CircuitBreaker(
        BreakerSettings(error_rate=0.05, window_seconds=60, min_answers=10), clock=lambda: now[0]
    )
    for n in range(9):
        breaker.record(f"f{n}", failed=True)
    assert breaker.state == "closed"  # nine answers are too few to judge
    now[0] = 61  # they leave the window
    for n in range(19):
        breaker.record(f"ok{n}", failed=False)
    breaker.record("bad", failed=True)
    assert breaker.state == "closed"  # 1 in 20: exactly 5 %, not more
    breaker.record("bad2", failed=True)
    assert breaker.state == "open" and breaker.allowance(4) == 0
    now[0] = 61 + 30
    assert breaker.allowance(4) == 1  # half-open: one probe
    breaker.started("probe")
    assert breaker.allowance(4) == 0
    breaker.record("straggler", failed=True)  # an answer from before decides nothing
    breaker.record("probe", failed=False)
    assert (breaker.state, breaker.allowance(4), breaker.opened) == ("closed", 4, 1)
