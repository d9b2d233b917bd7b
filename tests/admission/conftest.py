"""An in-process dispatcher over the test Redis and database, with a clock the test moves."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from apps.admission.dispatcher import Dispatcher, Options
from apps.admission.management.commands.run_dispatcher import CompletionPass
from apps.chat.generation import request_publish
from chatsite.redis_client import get_redis
from worker.protocol import Keys, WorkItem, new_request_id


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
    # This machine's own load must not shed the tests' requests: level 0 unless a test sets one.
    force_level(0)

    def make(*, injected: bool = True, **options) -> Dispatcher:
        # Every pass sweeps, recomputes the whole line's order, tells positions and rereads
        # the workers' heartbeats.
        opts = dict(block_ms=1, position_interval=0, position_share=1.0, sweep_interval=0,
                    degradation_interval=0, fleet_interval=0)  # fmt: skip
        opts.update(options)
        return Dispatcher(
            client=get_redis(), keys=Keys(prefix=redis_prefix), options=Options(**opts),
            clock=clock if injected else time.time,
            bucket_clock=clock.ms if injected else None,
            on_completion_pass=CompletionPass(),
        )  # fmt: skip

    return make


def publish(user_id, *, conversation="999999", max_tokens=64, prompt_tokens=100, kind="chat"):
    item = WorkItem(
        id=new_request_id(), user_id=str(user_id), conversation_id=str(conversation),
        messages=[{"role": "user", "content": "Say hi."}], max_tokens=max_tokens,
        temperature=0.0, prompt_tokens_estimate=prompt_tokens, kind=kind,
    )  # fmt: skip
    request_publish(item=item)
    return item.id


def events(request_id: str) -> list[dict]:
    keys = Keys(prefix=settings.SLUICE_REDIS_PREFIX)
    return [fields for _, fields in get_redis().xrange(keys.output(request_id))]


def final(request_id: str) -> dict | None:
    return next((e for e in events(request_id) if e["type"] == "final"), None)
