"""Writes: assigning plans to users; a stop for a request."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from chatsite.redis_client import get_redis
from worker.protocol import CANCEL_TTL_SECONDS, Keys

from .keys import STATE_TTL_SECONDS, AdmissionKeys
from .models import Plan, UserPlan


@transaction.atomic
def plan_assign(*, user, plan: Plan | None) -> UserPlan | None:
    """Gives `user` its own plan; None returns the user to the default plan."""
    if plan is None:
        UserPlan.objects.filter(user=user).delete()
        return None
    override, _ = UserPlan.objects.update_or_create(user=user, defaults={"plan": plan})
    return override


@transaction.atomic
def plan_make_default(*, plan: Plan) -> Plan:
    """Exactly one default plan: setting one unsets the others."""
    Plan.objects.exclude(pk=plan.pk).filter(is_default=True).update(is_default=False)
    if not plan.is_default:
        plan.is_default = True
        plan.save(update_fields=["is_default"])
    return plan


def request_cancel_signal(*, request_id: str) -> None:
    """Stops a request wherever it is: the flag a worker checks between batches, and a note to
    the dispatcher, whose sweep ends the request at once if it is still waiting in line. (The
    dispatcher also finds flags set without the note, but reads only a slice of a long queue's
    flags per sweep, so a stop deep in the line would take longer to show.)"""
    prefix = settings.SLUICE_REDIS_PREFIX
    cancels = AdmissionKeys(prefix).cancels
    pipe = get_redis().pipeline(transaction=False)
    pipe.set(Keys(prefix=prefix).cancel(request_id), "1", ex=CANCEL_TTL_SECONDS)
    pipe.sadd(cancels, request_id)
    pipe.expire(cancels, STATE_TTL_SECONDS)
    pipe.execute()
