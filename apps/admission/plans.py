"""The dispatcher's view of plans: every plan and override loaded at once, refreshed every few
seconds, so a decision never waits on PostgreSQL."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .models import DegradationSettings, Plan, UserPlan

# Used when the database holds no default plan (a fresh or flushed database).
FALLBACK_PLAN = Plan(slug="default", name="Default", is_default=True)


@dataclass
class PlanBook:
    refresh_seconds: float = 5.0

    def __post_init__(self) -> None:
        self.loaded_at = -1e9
        self.plans: dict[int | None, Plan] = {}
        self.by_user: dict[str, int] = {}
        self.default: Plan = FALLBACK_PLAN
        self.lowest_weight = FALLBACK_PLAN.priority_weight
        self.degradation = DegradationSettings()

    def refresh(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self.loaded_at < self.refresh_seconds:
            return
        plans = {plan.id: plan for plan in Plan.objects.all()}
        self.plans = plans
        self.by_user = {str(u): p for u, p in UserPlan.objects.values_list("user_id", "plan_id")}
        defaults = [p for p in plans.values() if p.is_default]
        self.default = defaults[0] if defaults else FALLBACK_PLAN
        self.lowest_weight = min(
            (p.priority_weight for p in plans.values()), default=self.default.priority_weight
        )
        self.degradation = DegradationSettings.current()
        self.loaded_at = time.monotonic()

    def for_user(self, user_id: str) -> Plan:
        plan_id = self.by_user.get(user_id)
        return self.plans.get(plan_id, self.default) if plan_id else self.default

    def is_lowest(self, plan: Plan) -> bool:
        """Of the lowest weight, when some plan weighs more: shedding exists to protect the
        higher plans, so with a single plan (or all equal) nobody is shed."""
        highest = max((p.priority_weight for p in self.plans.values()), default=0)
        return plan.priority_weight <= self.lowest_weight < highest
