"""A user's admin page shows how close they are to their plan's limits: the last 24 hours
(what the daily limit counts), the last minute and the month, each user their own."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.admission.models import Plan, UserPlan
from apps.usage.models import HourlyUsage, RequestUsage
from tests.usage.test_feedback_and_pages import recorded

pytestmark = pytest.mark.django_db


def panel(page: str) -> str:
    """The usage section of a rendered admin page, with its whitespace collapsed."""
    found = re.search(r'<section class="usage-limits".*?</section>', page, re.S)
    assert found, "no usage panel on the page"
    return " ".join(found.group(0).split())


def test_a_users_admin_page_shows_their_usage_against_their_plan(user, other_user, admin_client):
    premium = Plan.objects.create(
        slug="premium", name="Premium", tokens_per_day=1000, tokens_per_minute=300
    )
    UserPlan.objects.create(user=user, plan=premium)
    recorded(user, "earlier")
    # Two days back: out of the last 24 hours; in this month unless the month began since.
    earlier = timezone.now() - timedelta(days=2)
    RequestUsage.objects.update(
        created=earlier, hour=earlier.replace(minute=0, second=0, microsecond=0)
    )
    HourlyUsage.objects.update(hour=earlier.replace(minute=0, second=0, microsecond=0))
    in_month = earlier >= timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    recorded(user, "today-1")
    recorded(user, "today-2")
    recorded(other_user, "theirs")

    mine = panel(admin_client.get(f"/admin/accounts/user/{user.pk}/change/").content.decode())
    assert "alice against the Premium plan" in mine
    assert "240 of 1000 tokens" in mine and 'value="24"' in mine  # two answers of 120
    assert "2 answers (limit 20 a minute" in mine
    assert f"This month: {240 + 120 * in_month} tokens in {2 + in_month} answers" in mine
    assert "/admin/ops/usage/?user=alice" in mine

    theirs = panel(
        admin_client.get(f"/admin/accounts/user/{other_user.pk}/change/").content.decode()
    )
    default = Plan.objects.get(is_default=True)
    assert f"mallory against the {default.name} plan" in theirs
    assert f"120 of {default.tokens_per_day} tokens" in theirs
    assert "This month: 120 tokens in 1 answer." in theirs


def test_the_add_user_page_and_people_without_the_admin_see_no_panel(
    user, admin_client, client_for
):
    added = admin_client.get("/admin/accounts/user/add/")
    assert added.status_code == 200 and b"usage-limits" not in added.content
    page = client_for(user).get(f"/admin/accounts/user/{user.pk}/change/")
    assert page.status_code == 302 and "/login/" in page["Location"]
