"""One rule decides a user's plan: the override, else the default plan, else the built-in one.
The web's lookup, the API's (with the key, in one statement) and the dispatcher's book apply it
alike in every case."""

from __future__ import annotations

import pytest

from apps.accounts.services import api_key_create, api_key_revoke
from apps.admission.models import Plan
from apps.admission.plans import FALLBACK_PLAN, PlanBook, plan_decide
from apps.admission.selectors import api_key_caller, plan_for_user
from apps.admission.services import plan_assign

pytestmark = pytest.mark.django_db


def field_values(plan: Plan) -> dict:
    return {f.attname: getattr(plan, f.attname) for f in Plan._meta.concrete_fields}


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
        _, raw = api_key_create(user=user, name="agrees")
        key_user, key_plan = api_key_caller(raw=raw)
        assert key_user == user and key_plan.slug == rule.slug
        assert field_values(key_plan) == field_values(rule)


def test_the_api_key_lookup_reads_every_field_of_the_plan_as_the_orm_does(user):
    """The key's statement reads the plan as JSON: each value must come back as its field's
    type (a weight of 3.0 reads back as the JSON number 3, a float only by its field)."""
    plan = Plan.objects.create(
        slug="odd",
        name="Odd",
        priority_weight=3.0,
        cost_weights={"chat": 1.5, "summary": 0.25},
        model_names=["a-model", "b-model"],
    )
    plan_assign(user=user, plan=plan)
    _, raw = api_key_create(user=user, name="fields")
    _, found = api_key_caller(raw=raw)
    expected = Plan.objects.get(pk=plan.pk)
    assert field_values(found) == field_values(expected)
    assert isinstance(found.priority_weight, float)
    assert found.model_names == ["a-model", "b-model"] and found.allows("b-model")


# committed for real: the caches hear a change once its transaction commits
@pytest.mark.django_db(transaction=True)
def test_a_bad_or_revoked_key_finds_no_caller(user):
    key, raw = api_key_create(user=user, name="soon revoked")
    assert api_key_caller(raw=raw)[0] == user
    assert api_key_caller(raw=raw + "x") is None
    api_key_revoke(user=user, key_id=key.id)
    assert api_key_caller(raw=raw) is None


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
