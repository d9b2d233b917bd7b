from __future__ import annotations

from django.contrib import admin

from apps.admission.models import DegradationSettings, Plan, UserPlan
from apps.admission.selectors import degradation_get, model_fleet, queue_depth
from apps.admission.services import plan_make_default


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "slug",
        "is_default",
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
        "max_concurrent",
        "priority_weight",
    )
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("models_served_now",)
    fieldsets = (
        (None, {"fields": ("name", "slug", "is_default", "priority_weight")}),
        (
            "Rates",
            {
                "fields": (
                    "requests_per_minute",
                    "burst_requests",
                    "tokens_per_minute",
                    "burst_tokens",
                    "tokens_per_day",
                )
            },
        ),
        (
            "Per request",
            {
                "fields": (
                    "max_concurrent",
                    "max_background_concurrent",
                    "max_queue_wait_seconds",
                    "max_tokens_cap",
                    "cost_weights",
                    "long_prompt_tokens",
                )
            },
        ),
        ("Models", {"fields": ("model_names", "models_served_now")}),
    )

    @admin.display(description="served now")
    def models_served_now(self, obj=None) -> str:
        try:
            fleet = model_fleet(fresh=True)
        except Exception:  # the admin page must render even while Redis is down
            return "unknown (Redis unreachable)"
        if not fleet.live:
            return "no live worker announces a model"
        return "; ".join(
            f"{name} ({slots} slots, {served_summary(fleet.capabilities.get(name, ()))})"
            for name, slots in sorted(fleet.live.items())
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if obj.is_default:
            plan_make_default(plan=obj)


def served_summary(served) -> str:
    """What a model's workers serve beyond plain sampling, as the admin lists it."""
    return "serves " + ", ".join(sorted(served)) if served else "plain sampling only"


@admin.register(UserPlan)
class UserPlanAdmin(admin.ModelAdmin):
    list_display = ("user", "plan")
    list_filter = ("plan",)
    search_fields = ("user__username", "user__email")
    raw_id_fields = ("user",)


@admin.register(DegradationSettings)
class DegradationSettingsAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "level_in_force",
        "backlog_threshold",
        "queue_wait_seconds_threshold",
        "cpu_percent_threshold",
        "gpu_memory_percent_threshold",
        "forced_level",
    )
    readonly_fields = ("level_in_force",)
    fieldsets = (
        ("In force now", {"fields": ("level_in_force",)}),
        (
            "Thresholds (level 1 when any signal reaches its threshold)",
            {
                "fields": (
                    "backlog_threshold",
                    "queue_wait_seconds_threshold",
                    "cpu_percent_threshold",
                    "gpu_memory_percent_threshold",
                    "level2_ratio",
                    "level3_ratio",
                )
            },
        ),
        (
            "Effects (the level from which each applies)",
            {
                "fields": (
                    "cap_max_tokens_level",
                    "capped_max_tokens",
                    "skip_retrieval_level",
                    "reject_lowest_plan_level",
                    "reject_retry_after_seconds",
                )
            },
        ),
        ("Override", {"fields": ("forced_level",)}),
    )

    @admin.display(description="level in force")
    def level_in_force(self, obj=None) -> str:
        state = degradation_get()
        try:
            depth = queue_depth()
        except Exception:  # the admin page must render even while Redis is down
            return "unknown (Redis unreachable)"
        if not state.signals:
            return f"level 0: {depth} queued (no dispatcher publishes a level)"
        signals = ", ".join(f"{k} at {v:.0%}" for k, v in state.signals.items())
        forced = " (forced)" if state.forced else ""
        return f"level {state.level}{forced}: {depth} queued; {signals} of its threshold"

    def has_add_permission(self, request):
        return not DegradationSettings.objects.exists()
