"""Which plan a user has, decided by one rule, and the dispatcher's view of every plan.

The rule (`plan_decide`): the user's override, else the default plan, else the built-in
`FALLBACK_PLAN`. Should several plans be marked default (the admin keeps one, a bulk update
could leave more), the one with the lowest id is it. Everything that asks applies this rule:
`selectors.plan_for_user` (the web), `PlanBook.for_user` (the dispatcher, from memory) and
`plan_slug_sql` (retrieval's one-statement corpus lookup); tests hold the three to it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from apps.admission.models import DegradationSettings, Plan, UserPlan

# Used when the database holds no default plan (a fresh or flushed database).
FALLBACK_PLAN = Plan(slug="default", name="Default", is_default=True)


def plan_decide(*, override: Plan | None, defaults: Iterable[Plan]) -> Plan:
    """The one rule: `override`, else the default plan with the lowest id, else the fallback."""
    if override is not None:
        return override
    return min(defaults, key=lambda plan: plan.id, default=FALLBACK_PLAN)


def model_choose(requested: str, *, plan: Plan, live: Iterable[str], configured: str) -> str:
    """The model a request runs on: the one it names; else the configured default
    (SLUICE_DEFAULT_MODEL) when the plan allows it; else the first (by name) that a live
    worker serves and the plan allows; else "": the stream that any worker reads (workers
    that announce no model serve only that one)."""
    if requested:
        return requested
    if configured and plan.allows(configured):
        return configured
    return min((m for m in live if m and plan.allows(m)), default="")


def plan_slug_sql(*, user: str, fallback: str) -> str:
    """`plan_decide` as an SQL expression: the slug of the plan of the user whose id is the
    parameter `user`, else the parameter `fallback` (FALLBACK_PLAN's slug); named parameters,
    as `%(name)s`."""
    return f"""COALESCE((
        SELECT p.slug FROM {Plan._meta.db_table} p
        LEFT JOIN {UserPlan._meta.db_table} up ON up.plan_id = p.id AND up.user_id = %({user})s
        WHERE up.id IS NOT NULL OR p.is_default
        ORDER BY up.id IS NULL, p.id LIMIT 1), %({fallback})s)"""


@dataclass
class PlanBook:
    """Every plan and override loaded at once, refreshed every few seconds, so a decision never
    waits on PostgreSQL."""

    refresh_seconds: float = 5.0

    def __post_init__(self) -> None:
        self.loaded_at = -1e9
        self.plans: dict[int | None, Plan] = {}
        self.overrides: dict[str, Plan] = {}  # user id → their own plan
        self.default: Plan = FALLBACK_PLAN
        self.lowest_weight = FALLBACK_PLAN.priority_weight
        self.degradation = DegradationSettings()

    def refresh(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self.loaded_at < self.refresh_seconds:
            return
        plans = {plan.id: plan for plan in Plan.objects.all()}
        self.plans = plans
        self.overrides = {
            str(user_id): plans[plan_id]
            for user_id, plan_id in UserPlan.objects.values_list("user_id", "plan_id")
            if plan_id in plans
        }
        self.default = plan_decide(
            override=None, defaults=(p for p in plans.values() if p.is_default)
        )
        self.lowest_weight = min(
            (p.priority_weight for p in plans.values()), default=self.default.priority_weight
        )
        self.degradation = DegradationSettings.current()
        self.loaded_at = time.monotonic()

    def for_user(self, user_id: str) -> Plan:
        # `plan_decide`, with the defaults decided once per refresh: this runs for every request.
        return self.overrides.get(user_id) or self.default

    def is_lowest(self, plan: Plan) -> bool:
        """Of the lowest weight, when some plan weighs more: shedding exists to protect the
        higher plans, so with a single plan (or all equal) nobody is shed."""
        highest = max((p.priority_weight for p in self.plans.values()), default=0)
        return plan.priority_weight <= self.lowest_weight < highest
