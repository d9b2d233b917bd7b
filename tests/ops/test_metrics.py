"""/metrics: Prometheus text for staff or a bearer token, with the admission figures."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_metrics_are_for_staff_or_the_token_only(client_for, user, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert Client().get("/metrics").status_code == 403
    assert client_for(user).get("/metrics").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    ok = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain")
