"""Plans and degradation settings in the admin: nonsense is refused with a clear message."""

from __future__ import annotations

import pytest

from apps.admission.models import Plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client_for, user):
    user.is_staff = user.is_superuser = True
    user.save()
    return client_for(user)


def plan_form(**changes):
    data = dict(
        name="Team",
        slug="team",
        requests_per_minute=30,
        burst_requests=10,
        tokens_per_minute=30000,
        burst_tokens=30000,
        tokens_per_day=900000,
        max_concurrent=2,
        max_background_concurrent=1,
        max_queue_wait_seconds=60,
        max_tokens_cap=512,
        priority_weight=2,
        cost_weights='{"chat": 1, "long": 2}',
        long_prompt_tokens=1500,
    )
    data.update(changes)
    return data


def test_a_valid_plan_is_saved_and_can_become_the_default(admin_client):
    response = admin_client.post("/admin/admission/plan/add/", plan_form(is_default="on"))
    assert response.status_code == 302
    assert list(Plan.objects.filter(is_default=True).values_list("slug", flat=True)) == ["team"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("requests_per_minute", "-5", "greater than or equal to 0"),
        ("burst_requests", "0", "Must be at least 1."),
        ("burst_tokens", "0", "Must be at least 1."),
        ("priority_weight", "0", "The weight must be greater than 0."),
        ("cost_weights", '{"chat": -1}', "positive number"),
    ],
)
def test_nonsense_is_refused_with_a_clear_message(admin_client, field, value, message):
    response = admin_client.post("/admin/admission/plan/add/", plan_form(**{field: value}))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Plan.objects.filter(slug="team").exists()


def test_degradation_settings_show_the_level_in_force(admin_client):
    from apps.admission.models import DegradationSettings

    row = DegradationSettings.current()
    page = admin_client.get(f"/admin/admission/degradationsettings/{row.pk}/change/")
    assert page.status_code == 200
    assert "level 0" in page.content.decode()
    bad = admin_client.post(
        f"/admin/admission/degradationsettings/{row.pk}/change/",
        {
            "backlog_threshold": 1000,
            "cpu_percent_threshold": 150,
            "gpu_memory_percent_threshold": 90,
            "level2_ratio": 1.5,
            "level3_ratio": 2,
            "cap_max_tokens_level": 1,
            "capped_max_tokens": 256,
            "skip_retrieval_level": 2,
            "reject_lowest_plan_level": 3,
            "reject_retry_after_seconds": 60,
        },
    )
    assert "A percentage between 0 (excluded) and 100." in bad.content.decode()
