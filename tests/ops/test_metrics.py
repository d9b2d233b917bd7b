"""/metrics: Prometheus text for staff or a bearer token, with the admission figures."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.admission.conftest import publish

pytestmark = pytest.mark.django_db


def test_metrics_are_for_staff_or_the_token_only(client_for, user, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert Client().get("/metrics").status_code == 403
    assert client_for(user).get("/metrics").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    ok = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain")


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
