"""The callers' cache (apps/admission/callers.py): an API key's user and plan are read from
PostgreSQL once, then from Redis, and every change that can alter them is seen at once."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from apps.accounts.services import api_key_create, api_key_hash, api_key_revoke
from apps.admission import callers
from apps.admission.models import Plan
from apps.admission.selectors import api_key_caller
from apps.admission.services import plan_assign

pytestmark = pytest.mark.django_db


@pytest.fixture
def key(user) -> str:
    return api_key_create(user=user, name="cached")[1]


def warm(raw: str, django_assert_num_queries) -> None:
    """The caller read twice: the second time from the cache alone."""
    api_key_caller(raw=raw)
    with django_assert_num_queries(0):
        assert api_key_caller(raw=raw) is not None


def test_the_second_request_reads_no_postgresql_and_finds_the_same_caller(
    user, key, django_assert_num_queries
):
    with django_assert_num_queries(1):
        stored_user, stored_plan = api_key_caller(raw=key)
    with django_assert_num_queries(0):
        cached_user, cached_plan = api_key_caller(raw=key)
    assert cached_user == stored_user == user and cached_user.username == user.username
    fields = [f.attname for f in Plan._meta.concrete_fields]
    assert [getattr(cached_plan, f) for f in fields] == [getattr(stored_plan, f) for f in fields]


# committed for real: the caches hear a change once its transaction commits
@pytest.mark.django_db(transaction=True)
def test_a_revoked_key_is_refused_at_once(user, key, django_assert_num_queries):
    warm(key, django_assert_num_queries)
    api_key_revoke(user=user, key_id=user.api_keys.get().id)
    assert api_key_caller(raw=key) is None


# committed for real: the caches hear a change once its transaction commits
@pytest.mark.django_db(transaction=True)
def test_a_deactivated_user_is_refused_at_once(user, key, django_assert_num_queries):
    warm(key, django_assert_num_queries)
    user.is_active = False
    user.save()
    assert api_key_caller(raw=key) is None


def test_a_login_keeps_the_cached_callers(user, key, django_assert_num_queries):
    warm(key, django_assert_num_queries)
    user.save(update_fields=["last_login"])
    with django_assert_num_queries(0):
        assert api_key_caller(raw=key)[0] == user


# committed for real: the caches hear a change once its transaction commits
@pytest.mark.django_db(transaction=True)
def test_plan_changes_reach_cached_callers_at_once(user, key, django_assert_num_queries):
    pro = Plan.objects.create(slug="pro", name="Pro", priority_weight=4)
    warm(key, django_assert_num_queries)
    plan_assign(user=user, plan=pro)
    assert api_key_caller(raw=key)[1].slug == "pro"
    warm(key, django_assert_num_queries)
    Plan.objects.filter(slug="pro").update(model_names=["only-this"])  # no save() signal
    assert api_key_caller(raw=key)[1].model_names == ["only-this"]


def test_a_change_while_a_miss_reads_postgresql_leaves_nothing_stale(user, key):
    missed = callers.lookup(api_key_hash(key))
    assert missed.hit is None
    callers.forget_all()  # a change commits between the miss and its write
    callers.remember(missed, user=user, plans=[])
    assert callers.lookup(api_key_hash(key)).hit is None
    callers.remember(callers.lookup(api_key_hash(key)), user=user, plans=[])
    assert callers.lookup(api_key_hash(key)).hit is not None


def test_without_redis_the_key_is_read_from_postgresql(user, key, monkeypatch):
    class Unreachable:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise RedisConnectionError("Redis is down")

            return fail

    monkeypatch.setattr(callers, "get_redis", Unreachable)
    assert api_key_caller(raw=key)[0] == user
    user.is_active = False
    user.save()  # its cache cannot be cleared: nothing was cached either
    assert api_key_caller(raw=key) is None
