"""Reads for the rest of Sluice: a user's plan and the degradation level in force.

Retrieval (apps/rag) asks `retrieval_degraded()` before its expensive steps; the level itself is
computed by the dispatcher and published in Redis every few seconds.
"""

from __future__ import annotations

import redis
from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from chatsite.redis_client import get_redis

from .degradation import Degradation
from .keys import AdmissionKeys
from .models import Plan, UserPlan
from .plans import FALLBACK_PLAN


def admission_keys() -> AdmissionKeys:
    return AdmissionKeys(prefix=settings.SLUICE_REDIS_PREFIX)


def plan_for_user(*, user) -> Plan:
    """The user's override, else the default plan (an unsaved built-in one if none is set)."""
    if user is None or not getattr(user, "pk", None):
        return Plan.objects.filter(is_default=True).order_by("id").first() or FALLBACK_PLAN
    # One query on every submit: the override and the default fetched together, override first.
    mine = Exists(UserPlan.objects.filter(user_id=user.pk, plan_id=OuterRef("pk")))
    plan = (
        Plan.objects.annotate(mine=mine)
        .filter(Q(mine=True) | Q(is_default=True))
        .order_by("-mine", "id")
        .first()
    )
    return plan or FALLBACK_PLAN


def degradation_get() -> Degradation:
    """The level in force and its effects; level 0 when no dispatcher publishes one (or Redis
    is unreachable: a web process then cannot submit anything anyway)."""
    try:
        return Degradation.from_json(get_redis().get(admission_keys().degradation))
    except redis.RedisError:
        return Degradation()


def degradation_level() -> int:
    return degradation_get().level


def retrieval_degraded() -> bool:
    """True while the service sheds load: skip expensive retrieval steps (reranking, query
    expansion, large candidate pools) and answer from the cheap ones."""
    return degradation_get().skip_retrieval


def admission_counters() -> dict[str, str]:
    return get_redis().hgetall(admission_keys().metrics)


def queue_depth() -> int:
    return get_redis().hlen(admission_keys().queue)
