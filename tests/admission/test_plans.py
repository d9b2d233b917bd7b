"""One rule decides a user's plan: the override, else the default plan, else the built-in one.
The web's lookup and the dispatcher's book apply it alike in every case."""

from __future__ import annotations

import pytest

from apps.admission.models import Plan
from apps.admission.plans import FALLBACK_PLAN, PlanBook, plan_decide
from apps.admission.selectors import plan_for_user
from apps.admission.services import plan_assign

pytestmark = pytest.mark.django_db


def assert_everyone_agrees(*users) -> None:
    book = PlanBook()
    book.refresh(force=True)
    for user in users:
        rule = plan_decide(
            override=next(iter(Plan.objects.filter(overrides__user=user)), None),
            defaults=Plan.objects.filter(is_default=True),
        )
        assert plan_for_user(user=user).slug == rule.slug
        assert book.for_user(str(user.id)).slug == rule.slug


def test_the_web_and_the_dispatcher_apply_the_same_rule(user, other_user):
    pro = Plan.objects.create(slug="pro", name="Pro", priority_weight=4)
    assert_everyone_agrees(user, other_user)  # both on the default plan
    plan_assign(user=other_user, plan=pro)
    assert_everyone_agrees(user, other_user)  # an override
    # Two plans marked default (a bulk update can do that): the lowest id is the default,
    # whatever order the plans are listed in (by weight, pro first).
    Plan.objects.filter(slug="pro").update(is_default=True)
    assert plan_for_user(user=user).slug == "free"
    assert_everyone_agrees(user, other_user)
    Plan.objects.update(is_default=False)  # none: the built-in fallback
    assert plan_for_user(user=user).slug == FALLBACK_PLAN.slug
    assert_everyone_agrees(user, other_user)


def test_the_rule_itself():
    free, pro = Plan(id=1, slug="free"), Plan(id=2, slug="pro")
    assert plan_decide(override=pro, defaults=[free]) is pro
    assert plan_decide(override=None, defaults=[pro, free]) is free
    assert plan_decide(override=None, defaults=[]) is FALLBACK_PLAN
