"""Writes: assigning plans to users."""

from __future__ import annotations

from django.db import transaction

from apps.admission.models import Plan, UserPlan


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
