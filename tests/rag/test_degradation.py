"""Under load the dispatcher publishes a degradation level; from level 2 retrieval takes the
cheap path (a small candidate pool) instead of the full one."""

from __future__ import annotations

from apps.admission.degradation import Degradation
from apps.rag.services import candidate_pool
from core.redis_client import get_redis, keys


def publish(degradation: Degradation) -> None:
    get_redis().set(keys().degradation, degradation.to_json(), ex=60)


def test_retrieval_uses_the_full_pool_normally_and_a_small_one_when_shedding(settings):
    settings.RAG_CANDIDATES, settings.RAG_DEGRADED_CANDIDATES = 40, 8
    assert candidate_pool() == 40  # nothing published: level 0
    publish(Degradation(level=1, skip_retrieval=False))
    assert candidate_pool() == 40
    publish(Degradation(level=2, skip_retrieval=True))
    assert candidate_pool() == 8
