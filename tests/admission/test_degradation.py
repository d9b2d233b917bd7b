"""Degradation signals measure pressure on the service itself: people's backlog, how long their
requests wait, the web's and the dispatcher's own CPU, the workers' GPU memory. Work Sluice
starts itself and an inference worker's CPU on the same machine are not pressure."""

from __future__ import annotations

import time

import pytest

from apps.admission.degradation import cpu_share_publish
from apps.admission.models import DegradationSettings
from apps.admission.selectors import degradation_get
from core.redis_client import get_redis
from tests.admission.conftest import force_level, keys, publish, roomy_plan

pytestmark = pytest.mark.django_db


def thresholds(**values) -> None:
    row = DegradationSettings.current()
    # The in-process dispatcher's own CPU is this test process's: not what these tests measure.
    row.cpu_percent_threshold = 1e6
    for name, value in values.items():
        setattr(row, name, value)
    row.forced_level = None
    row.save()


def computed(dispatcher):
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    return degradation_get()


def test_background_work_waiting_is_not_a_backlog(make_dispatcher, user):
    roomy_plan()
    dispatcher = make_dispatcher()
    thresholds(backlog_threshold=2)
    for _ in range(3):
        publish(user.id, kind="background")  # no worker: they wait
    dispatcher.step()
    assert computed(dispatcher).level == 0
    for _ in range(2):
        publish(user.id)
    dispatcher.step()
    level = computed(dispatcher)
    assert level.level == 1 and level.signals["backlog"] == 1.0
    assert level.sources["backlog"] == "people's requests waiting for a worker: 2"


def test_a_person_waiting_long_for_a_worker_degrades_the_service(make_dispatcher, user, clock):
    roomy_plan()
    dispatcher = make_dispatcher()
    thresholds(queue_wait_seconds_threshold=10)
    publish(user.id)  # no worker: it waits
    dispatcher.step()
    assert computed(dispatcher).level == 0
    clock.now += 12
    level = computed(dispatcher)
    assert level.level == 1 and level.signals["wait"] >= 1
    assert "longest wait of a person's request" in level.sources["wait"]


def test_a_busy_web_process_degrades_the_service_and_a_stopped_one_does_not(make_dispatcher):
    dispatcher = make_dispatcher()
    # One core is 100 %: a web process's threads together may pass it (this test process,
    # the in-process dispatcher, never gets near 150 % on its own).
    thresholds(cpu_percent_threshold=100)
    now_ms = int(time.time() * 1000)
    client = get_redis()
    cpu_share_publish(client, keys(), name="web:box:41", percent=150.0, now_ms=now_ms)
    cpu_share_publish(client, keys(), name="web:box:42", percent=5.0, now_ms=now_ms)
    level = computed(dispatcher)
    assert level.level == 2 and level.signals["cpu"] == 1.5
    assert level.sources["cpu"].startswith("busiest Sluice process, its own CPU: web:box:41 at 150")
    # A web process that stopped publishing a minute ago says nothing about now.
    cpu_share_publish(client, keys(), name="web:box:41", percent=150.0, now_ms=now_ms - 60_000)
    level = computed(dispatcher)
    assert level.signals["cpu"] < 1.5 and "web:box:41" not in client.hgetall(keys().process_cpu())


def test_the_settings_say_what_each_signal_measures(make_dispatcher):
    force_level(None)
    level = computed(make_dispatcher())
    assert set(level.signals) == {"backlog", "wait", "cpu", "gpu_memory"}
    assert "no worker reports GPU memory" in level.sources["gpu_memory"]


def test_the_operations_page_shows_each_signal_with_its_source(make_dispatcher, client_for, user):
    dispatcher = make_dispatcher()
    thresholds()
    publish(user.id)  # no worker: it waits
    dispatcher.step()
    computed(dispatcher)
    user.is_staff = True
    user.save()
    page = client_for(user).get("/admin/ops/live/", {"since": "0-0"}).content.decode()
    for shown in (
        "people&#x27;s requests waiting for a worker: 1",
        "longest wait of a person&#x27;s request for a worker",
        "busiest Sluice process, its own CPU: dispatcher:",
        "no worker reports GPU memory",
    ):
        assert shown in page, shown
