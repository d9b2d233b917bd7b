"""An in-process dispatcher over the test Redis and database, with a clock the test moves."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from apps.admission.dispatcher import Dispatcher, Options
from apps.chat.submission import request_publish
from apps.ops.management.commands.run_dispatcher import RecorderPass
from contract.protocol import Keys, WorkItem, new_request_id
from core.redis_client import get_redis


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def ms(self) -> int:
        return int(self.now * 1000)


@pytest.fixture
def admission(settings):
    settings.SLUICE_ADMISSION = True


@pytest.fixture
def clock():
    return Clock()


def force_level(level: int | None) -> None:
    from apps.admission.models import DegradationSettings

    row = DegradationSettings.current()
    row.forced_level = level
    row.save()


@pytest.fixture
def make_dispatcher(admission, clock, redis_prefix):
    # The in-process dispatcher's CPU signal is this test process's own: level 0 unless a test
    # sets one.
    force_level(0)

    def make(*, injected: bool = True, **options) -> Dispatcher:
        # Every pass sweeps, recomputes the whole line's order, tells positions, rereads the
        # workers' heartbeats and looks for lost requests.
        opts = dict(
            block_ms=1,
            position_interval=0,
            position_share=1.0,
            sweep_interval=0,
            degradation_interval=0,
            fleet_interval=0,
            reconcile_interval=0,
        )
        opts.update(options)
        return Dispatcher(
            client=get_redis(),
            keys=Keys(prefix=redis_prefix),
            options=Options(**opts),
            clock=clock if injected else time.time,
            bucket_clock=clock.ms if injected else None,
            recorder_pass=RecorderPass(),
        )

    return make


def publish(user_id, *, conversation="999999", max_tokens=64, prompt_tokens=100, kind="chat"):
    """A request as the web submits it."""
    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id=str(conversation),
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=max_tokens,
        temperature=0.0,
        prompt_tokens_estimate=prompt_tokens,
        kind=kind,
    )
    request_publish(item=item)
    return item.id


def keys() -> Keys:
    return Keys(prefix=settings.SLUICE_REDIS_PREFIX)


def events(request_id: str) -> list[dict]:
    return [fields for _, fields in get_redis().xrange(keys().output(request_id))]


def final(request_id: str) -> dict | None:
    return next((e for e in events(request_id) if e["type"] == "final"), None)


def state(request_id: str) -> str | None:
    return get_redis().hget(keys().request(request_id), "state")


def counters() -> dict[str, int]:
    """The admission counters /metrics reads, by name (`requests:rejected:rate`, ...)."""
    return {k: int(float(v)) for k, v in get_redis().hgetall(keys().metrics).items()}


def give_the_fleet_slots(slots: int, *, worker_id: str = "w-test", running=()) -> None:
    """A live worker with `slots`, as its heartbeat tells the dispatcher."""
    import json

    beat = {
        "worker_id": worker_id,
        "slots": slots,
        "busy": len(running),
        "healthy": True,
        "running": list(running),
    }
    client = get_redis()
    client.set(keys().heartbeat(worker_id), json.dumps(beat), ex=60)
    client.zadd(keys().workers, {worker_id: time.time()})


def work_item_ids(stream: str) -> list[str]:
    return [fields["id"] for _, fields in get_redis().xrange(stream)]


def worker_answers(
    request_id: str,
    *,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    worker_id: str = "w-test",
    record: bool = True,
    duration_ms: float = 1000,
) -> None:
    """Does what a worker does with a work item: starts an attempt, ends it done, adds the
    answer record (unless `record` is False: as if Redis lost it) and deletes the item."""
    from contract import transitions
    from contract.protocol import Answer, State, Usage

    client, k, token = get_redis(), keys(), f"token-{request_id}"
    pipe = client.pipeline(transaction=False)
    transitions.start(pipe, k, request_id, token=token, worker_id=worker_id)
    started = transitions.start_result(pipe.execute()[0])
    owner = client.hgetall(k.request(request_id))
    answer = Answer(
        id=request_id,
        user_id=owner["user_id"],
        conversation_id=owner["conversation_id"],
        state=State.DONE,
        text="Hi there.",
        worker_id=worker_id,
        attempt=started.attempt,
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            duration_ms=duration_ms,
        ),
    )
    pipe = client.pipeline(transaction=False)
    transitions.finish(pipe, k, answer, token=token)
    if record:
        transitions.answer_record(pipe, k, answer)
    pipe.execute()
    for stream in (k.work, k.work_for(worker_id)):
        for entry_id, fields in client.xrange(stream):
            if fields.get("id") == request_id:
                client.xdel(stream, entry_id)


def roomy_plan(**limits):
    """The default plan with room for hundreds of requests at once: nothing waits on a rate.
    Seeded again first if a transactional test before this one flushed the migration's rows."""
    import importlib

    from django.apps import apps

    from apps.admission.models import Plan

    importlib.import_module("apps.admission.migrations.0002_default_plans").create(apps, None)

    values = dict(
        burst_requests=10_000,
        requests_per_minute=10_000,
        burst_tokens=10_000_000,
        tokens_per_minute=10_000_000,
        tokens_per_day=100_000_000,
    )
    values.update(limits)
    Plan.objects.filter(slug="free").update(**values)
    return Plan.objects.get(slug="free")


def queue_many(users, per_user: int) -> list[str]:
    return [publish(user.id) for _ in range(per_user) for user in users]


@pytest.fixture
def packets(monkeypatch) -> list[list[bytes]]:
    """What the dispatcher sends Redis, one entry per round trip: its commands' names."""
    import redis.connection

    sent: list[list[bytes]] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def watched(self, command, check_health=True):
        packet = command if isinstance(command, bytes) else b"".join(command)
        lines = packet.split(b"\r\n")
        sent.append([lines[i + 2] for i, line in enumerate(lines[:-2]) if line.startswith(b"*")])
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", watched)
    return sent
