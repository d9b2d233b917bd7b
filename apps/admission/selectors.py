"""Reads for the rest of Sluice: a user's plan and the degradation level in force.

Retrieval (apps/rag) asks `retrieval_degraded()` before its expensive steps; the level itself is
computed by the dispatcher and published in Redis every few seconds.
"""

from __future__ import annotations

import redis
from django.db.models import Exists, OuterRef, Q

from chatsite.redis_client import get_redis, keys

from .degradation import Degradation
from .models import Plan, UserPlan
from .plans import plan_decide


def plan_for_user(*, user) -> Plan:
    """The user's plan (see plans.plan_decide), in one query: the override and the default
    plans fetched together."""
    user_id = getattr(user, "pk", None) if user is not None else None
    candidates = Plan.objects.filter(is_default=True)
    if user_id:
        mine = Exists(UserPlan.objects.filter(user_id=user_id, plan_id=OuterRef("pk")))
        candidates = Plan.objects.annotate(mine=mine).filter(Q(mine=True) | Q(is_default=True))
    plans = list(candidates)
    override = next((plan for plan in plans if getattr(plan, "mine", False)), None)
    return plan_decide(override=override, defaults=[plan for plan in plans if plan.is_default])


def degradation_get() -> Degradation:
    """The level in force and its effects; level 0 when no dispatcher publishes one (or Redis
    is unreachable: a web process then cannot submit anything anyway)."""
    try:
        return Degradation.from_json(get_redis().get(keys().degradation))
    except redis.RedisError:
        return Degradation()


def degradation_level() -> int:
    return degradation_get().level


def retrieval_degraded() -> bool:
    """True while the service sheds load: skip expensive retrieval steps (reranking, query
    expansion, large candidate pools) and answer from the cheap ones."""
    return degradation_get().skip_retrieval


def admission_counters() -> dict[str, str]:
    return get_redis().hgetall(keys().metrics)


def queue_depth() -> int:
    return get_redis().hlen(keys().queue)
