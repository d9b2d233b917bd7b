"""The chat's one-statement corpus lookup follows the same access rule as `corpora_for_user`,
and picks the user's plan by admission's one rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, Group
from django.db import connection

from apps.admission.models import Plan, UserPlan
from apps.admission.plans import FALLBACK_PLAN, plan_slug_sql
from apps.admission.selectors import plan_for_user
from apps.rag.models import Corpus
from apps.rag.selectors import corpora_for_user, searchable_corpora_for_user


def _ids(corpora) -> set[int]:
    return {c.pk for c in corpora}


def _expected(user) -> set[int]:
    return _ids(corpora_for_user(user=user).filter(chunk_count__gt=0))


@pytest.fixture
def corpora(db):
    staff = Group.objects.create(name="staff-readers")
    pro = Plan.objects.create(slug="pro", name="Pro")

    def make(name, **fields):
        return Corpus.objects.create(name=name, chunk_count=fields.pop("chunks", 5), **fields)

    everyone = make("open", access=Corpus.Access.EVERYONE)
    make("empty", access=Corpus.Access.EVERYONE, chunks=0)
    make("off", access=Corpus.Access.EVERYONE, is_active=False)
    by_group = make("by-group")
    by_group.groups.add(staff)
    by_plan = make("by-plan", plans=["pro"])
    by_default_plan = make("by-default-plan", plans=["free"])  # the migration's default plan
    by_fallback_plan = make("by-fallback-plan", plans=["default"])
    make("closed")
    return {
        "staff": staff,
        "pro": pro,
        "everyone": everyone,
        "by_group": by_group,
        "by_plan": by_plan,
        "by_default_plan": by_default_plan,
        "by_fallback_plan": by_fallback_plan,
    }


def test_same_corpora_as_the_orm_rule_for_every_kind_of_user(corpora, user, other_user):
    assert (
        _ids(searchable_corpora_for_user(user=user))
        == _expected(user)
        == {corpora["everyone"].pk, corpora["by_default_plan"].pk}
    )

    other_user.groups.add(corpora["staff"])
    UserPlan.objects.create(user=other_user, plan=corpora["pro"])
    assert (
        _ids(searchable_corpora_for_user(user=other_user))
        == _expected(other_user)
        == {corpora["everyone"].pk, corpora["by_group"].pk, corpora["by_plan"].pk}
    )

    # With no default plan saved, the built-in fallback ("default") applies.
    Plan.objects.update(is_default=False)
    assert (
        _ids(searchable_corpora_for_user(user=user))
        == _expected(user)
        == {corpora["everyone"].pk, corpora["by_fallback_plan"].pk}
    )
    # A plan made the default takes over at once.
    Plan.objects.filter(slug="pro").update(is_default=True)
    assert (
        _ids(searchable_corpora_for_user(user=user))
        == _expected(user)
        == {corpora["everyone"].pk, corpora["by_plan"].pk}
    )


def test_revoked_access_applies_at_once(corpora, other_user):
    other_user.groups.add(corpora["staff"])
    assert corpora["by_group"].pk in _ids(searchable_corpora_for_user(user=other_user))
    other_user.groups.remove(corpora["staff"])
    assert corpora["by_group"].pk not in _ids(searchable_corpora_for_user(user=other_user))


def test_anonymous_and_inactive_users_get_nothing(corpora, user):
    assert searchable_corpora_for_user(user=AnonymousUser()) == []
    user.is_active = False
    assert searchable_corpora_for_user(user=user) == []


def _plan_by_sql(user) -> str:
    sql = f"SELECT {plan_slug_sql(user='user', fallback='fallback')}"
    with connection.cursor() as cursor:
        cursor.execute(sql, {"user": user.pk, "fallback": FALLBACK_PLAN.slug})
        return cursor.fetchone()[0]


def test_the_sql_picks_the_plan_by_the_one_rule(db, user, other_user):
    # The plan retrieval's one statement picks against admission's rule (plan_for_user applies
    # it), in every case the rule distinguishes.
    pro = Plan.objects.create(slug="pro", name="Pro")
    cases = [
        lambda: None,  # the default plan
        lambda: UserPlan.objects.create(user=other_user, plan=pro),  # an override
        lambda: Plan.objects.filter(slug="pro").update(is_default=True),  # two defaults
        lambda: Plan.objects.update(is_default=False),  # none: the built-in fallback
    ]
    seen = set()
    for change in cases:
        change()
        for person in (user, other_user):
            assert _plan_by_sql(person) == plan_for_user(user=person).slug
            seen.add(_plan_by_sql(person))
    assert seen == {"free", "pro", FALLBACK_PLAN.slug}
