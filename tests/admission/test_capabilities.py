"""What a request of each model may ask, as the web reads it from the workers' heartbeats: what
every worker that may read the model's work can serve, so no worker drops a parameter it does not
know."""

from __future__ import annotations

import json
import time

import pytest

from apps.admission.selectors import model_capabilities, model_fleet
from contract.capabilities import SAMPLING_AND_STRUCTURED
from core.redis_client import get_redis
from tests.admission.conftest import keys, roomy_plan


def beat(worker_id: str, model: str, capabilities: list[str] | None, **state) -> None:
    heartbeat = {"worker_id": worker_id, "model": model, "slots": 2, "healthy": True, **state}
    if capabilities is not None:  # None: a worker of a release before capabilities
        heartbeat["capabilities"] = capabilities
    client = get_redis()
    client.set(keys().heartbeat(worker_id), json.dumps(heartbeat), ex=60)
    client.zadd(keys().workers, {worker_id: time.time()})


def test_a_model_offers_what_every_worker_that_reads_its_work_can_serve():
    full = sorted(SAMPLING_AND_STRUCTURED)
    beat("a-new", "alpha", full)
    beat("a-old", "alpha", None)  # mid-upgrade: still on the previous release
    beat("b1", "beta", full)
    beat("b2", "beta", ["seed"])
    beat("g1", "gamma", [])  # the simulated engine
    model_fleet(fresh=True)
    assert model_capabilities(model="alpha") == frozenset()
    assert model_capabilities(model="beta") == {"seed"}
    assert model_capabilities(model="gamma") == frozenset()
    assert model_capabilities(model="nobody-serves-this") == frozenset()

    # The older worker drains for its upgrade: it reads no more work, and alpha offers it all.
    # An unhealthy one still counts: it reads work again once it recovers.
    beat("a-old", "alpha", None, draining=True)
    beat("b2", "beta", ["seed"], healthy=False)
    model_fleet(fresh=True)
    assert model_capabilities(model="alpha") == SAMPLING_AND_STRUCTURED
    assert model_capabilities(model="beta") == {"seed"}


@pytest.mark.django_db
def test_the_plan_admin_says_what_each_served_model_can_do(client_for, user):
    user.is_staff = user.is_superuser = True
    user.save()
    beat("a1", "alpha", sorted(SAMPLING_AND_STRUCTURED))
    beat("b1", "beta", [])
    plan = roomy_plan()
    page = client_for(user).get(f"/admin/admission/plan/{plan.pk}/change/").content.decode()
    assert "alpha (2 slots, serves json_object, json_schema, penalties, seed)" in page
    assert "beta (2 slots, plain sampling only)" in page
