"""The admission figures as /metrics shows them (access rules: tests/ops/test_metrics.py)."""

from __future__ import annotations

import pytest

from tests.admission.conftest import publish

pytestmark = pytest.mark.django_db


def test_metrics_count_admission_outcomes(make_dispatcher, client_for, user):
    from apps.admission.models import Plan

    Plan.objects.filter(slug="free").update(burst_tokens=500)
    publish(user.id, max_tokens=1000)  # too large: rejected
    publish(user.id, max_tokens=64)  # queued (no worker)
    make_dispatcher().step()
    user.is_staff = True
    user.save()
    body = client_for(user).get("/metrics").content.decode()
    assert 'sluice_requests_total{status="rejected"} 1' in body
    assert 'sluice_requests_total{status="admitted"} 1' in body
    assert "sluice_queue_depth 1" in body
    assert "sluice_degradation_level 0" in body
    assert 'sluice_admission_latency_seconds_bucket{le="+Inf"} 2' in body
