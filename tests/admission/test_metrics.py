"""The admission figures as /metrics shows them (access rules: tests/ops/test_metrics.py), and
the counters by reason an operator reads to tell a busy fleet from users over their limits."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.admission.metrics import REASONS, STATUSES
from apps.admission.models import Plan
from apps.admission.selectors import admission_counters
from tests.admission.conftest import publish

pytestmark = pytest.mark.django_db


def test_metrics_count_admission_outcomes(make_dispatcher, client_for, user):
    Plan.objects.filter(slug="free").update(burst_tokens=500)
    publish(user.id, max_tokens=1000)  # too large: rejected
    publish(user.id, max_tokens=64)  # queued (no worker)
    make_dispatcher().step()
    user.is_staff = True
    user.save()
    body = client_for(user).get("/metrics").content.decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
    }
    assert values[("sluice_requests_total", (("status", "rejected"),))] == 1
    assert values[("sluice_requests_total", (("status", "admitted"),))] == 1
    assert values[("sluice_requests_total", (("status", "withdrawn"),))] == 0
    assert values[("sluice_queue_depth", ())] == 1
    assert values[("sluice_degradation_level", ())] == 0
    assert values[("sluice_admission_latency_seconds_bucket", (("le", "+Inf"),))] == 2


def test_each_rejection_and_timeout_is_counted_under_its_reason(make_dispatcher, user, clock):
    Plan.objects.filter(slug="free").update(
        burst_tokens=500, tokens_per_minute=500, max_queue_wait_seconds=5
    )
    publish(user.id, max_tokens=1000)  # more than the plan allows at once
    publish(user.id, prompt_tokens=100, max_tokens=300)  # charged, waits for a worker
    publish(user.id, prompt_tokens=100, max_tokens=300)  # over the token rate: 48 s away
    dispatcher = make_dispatcher()
    dispatcher.step()
    clock.now += 6
    dispatcher.step()  # the charged one found no worker in time
    counters = admission_counters()
    assert counters["requests:rejected"] == "2"
    assert counters["requests:rejected:too_large"] == "1"
    assert counters["requests:rejected:rate"] == "1"
    assert counters["requests:timed_out:no_worker"] == "1"
    named = {f"requests:{s}:{r}" for s, reasons in REASONS.items() for r in reasons}
    assert {k for k in counters if k.count(":") == 2} <= named
    assert all(status in STATUSES for status in REASONS)
