"""Plans (what each user may send) and the degradation thresholds, both edited in the admin.

The dispatcher reads these rows every few seconds; it never queries them per request.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from core.querysets import NotifyingManager

positive = [MinValueValidator(1, "Must be at least 1.")]


def default_cost_weights() -> dict[str, float]:
    # Per request kind (apps/admission/kinds.py); a kind not listed weighs 1.
    return {"chat": 1, "rag": 1, "long": 2, "background": 1}


class Plan(models.Model):
    """Limits of one class of users. Rates are sustained refills; bursts are bucket sizes."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=80)
    is_default = models.BooleanField(
        default=False, help_text="Users without an override get this plan (exactly one)."
    )
    requests_per_minute = models.PositiveIntegerField(default=20, validators=positive)
    burst_requests = models.PositiveIntegerField(
        default=10,
        validators=positive,
        help_text="Requests that may arrive back to back before the per-minute rate applies.",
    )
    tokens_per_minute = models.PositiveIntegerField(default=20_000, validators=positive)
    burst_tokens = models.PositiveIntegerField(
        default=20_000,
        validators=positive,
        help_text="Largest token spend at once (prompt + answer); also the largest request.",
    )
    tokens_per_day = models.PositiveIntegerField(default=500_000, validators=positive)
    max_concurrent = models.PositiveIntegerField(
        default=2, validators=positive, help_text="Requests running on workers at once."
    )
    max_background_concurrent = models.PositiveIntegerField(
        default=1,
        db_default=1,  # rows the previous release inserts during an upgrade (docs/deploy.md)
        validators=positive,
        help_text="Background requests (summaries, titles, follow-ups) of one user running at "
        "once; they never count against max concurrent.",
    )
    max_queue_wait_seconds = models.PositiveIntegerField(
        default=120,
        validators=positive,
        help_text="A request waiting longer fails with a message to retry.",
    )
    max_tokens_cap = models.PositiveIntegerField(
        default=1024, validators=positive, help_text="Longest answer, in tokens."
    )
    priority_weight = models.FloatField(
        default=1.0, help_text="Share of the workers under contention (fair queue weight)."
    )
    cost_weights = models.JSONField(
        default=default_cost_weights,
        blank=True,
        help_text="What a request of each kind counts: its requests, tokens and fair-queue "
        'cost times this weight, e.g. {"chat": 1, "rag": 1, "long": 2, "background": 1} '
        "(a kind not listed weighs 1).",
    )
    long_prompt_tokens = models.PositiveIntegerField(
        default=1500,
        validators=positive,
        help_text="A prompt over this many tokens makes its request of the kind long.",
    )
    model_names = ArrayField(
        models.CharField(max_length=200),
        default=list,
        blank=True,
        verbose_name="models",
        help_text="Model names this plan may use, comma-separated (as workers announce "
        "them, and all-MiniLM-L6-v2 for embeddings). Empty: every model.",
    )

    objects = NotifyingManager()  # bulk writes reach the API callers cache (callers.py)

    class Meta:
        ordering = ["-priority_weight", "slug"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = {}
        if self.priority_weight is not None and self.priority_weight <= 0:
            errors["priority_weight"] = "The weight must be greater than 0."
        if not isinstance(self.cost_weights, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
            for k, v in (self.cost_weights or {}).items()
        ):
            errors["cost_weights"] = (
                'Give an object of request type to a positive number, e.g. {"chat": 1}.'
            )
        if self.burst_tokens and self.tokens_per_day and self.burst_tokens > self.tokens_per_day:
            errors["burst_tokens"] = "The token burst cannot exceed the tokens per day."
        # The bucket script keeps levels exact in doubles (scaled by the window, see buckets.lua).
        if self.tokens_per_day and self.tokens_per_day > 100_000_000:
            errors["tokens_per_day"] = "At most 100,000,000 tokens per day."
        if errors:
            raise ValidationError(errors)

    def cost_weight(self, kind: str) -> float:
        return float((self.cost_weights or {}).get(kind, 1))

    def allows(self, model: str) -> bool:
        """Whether this plan may use `model` (a plan that lists none may use every one)."""
        return not self.model_names or model in self.model_names


class UserPlan(models.Model):
    """A per-user override of the default plan."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="plan_override"
    )
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="overrides")

    objects = NotifyingManager()  # bulk writes reach the API callers cache (callers.py)

    def __str__(self) -> str:
        return f"{self.user} → {self.plan}"


class DegradationSettings(models.Model):
    """When the service degrades and what each level does (one row, edited in the admin).

    Each signal is a ratio of its threshold; the largest ratio picks the level: at 1 the
    service is at level 1, at `level2_ratio` level 2, at `level3_ratio` level 3.
    """

    backlog_threshold = models.PositiveIntegerField(
        default=1000,
        validators=positive,
        help_text="People's requests waiting for a worker (background work not counted).",
    )
    queue_wait_seconds_threshold = models.FloatField(
        default=30.0,
        validators=[MinValueValidator(0.1)],
        help_text="The longest a person's request waited for a worker, in seconds.",
    )
    cpu_percent_threshold = models.FloatField(
        default=80.0,
        help_text="The busiest web or dispatcher process's own CPU, % of one core (inference "
        "workers on the same machine are not counted).",
    )
    gpu_memory_percent_threshold = models.FloatField(
        default=90.0, help_text="Workers' KV-cache / GPU memory use, %."
    )
    level2_ratio = models.FloatField(default=1.5)
    level3_ratio = models.FloatField(default=2.0)
    cap_max_tokens_level = models.PositiveSmallIntegerField(default=1)
    capped_max_tokens = models.PositiveIntegerField(default=256, validators=positive)
    skip_retrieval_level = models.PositiveSmallIntegerField(default=2)
    reject_lowest_plan_level = models.PositiveSmallIntegerField(default=3)
    reject_retry_after_seconds = models.PositiveIntegerField(default=60, validators=positive)
    forced_level = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Set to hold a level by hand (0 to 3); empty: computed."
    )

    class Meta:
        verbose_name = verbose_name_plural = "degradation settings"

    def __str__(self) -> str:
        return "Degradation settings"

    def clean(self) -> None:
        errors = {}
        for name in ("cpu_percent_threshold", "gpu_memory_percent_threshold"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 100:
                errors[name] = "A percentage between 0 (excluded) and 100."
        if self.level2_ratio is not None and self.level2_ratio < 1:
            errors["level2_ratio"] = "Level 2 starts at a ratio of 1 or more."
        if None not in (self.level2_ratio, self.level3_ratio) and (
            self.level3_ratio < self.level2_ratio
        ):
            errors["level3_ratio"] = "Level 3 cannot start below level 2."
        for name in ("cap_max_tokens_level", "skip_retrieval_level", "reject_lowest_plan_level"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 4:
                errors[name] = "A level from 1 to 3 (4 turns the effect off)."
        if self.forced_level is not None and self.forced_level > 3:
            errors["forced_level"] = "Levels go from 0 to 3."
        if errors:
            raise ValidationError(errors)

    @classmethod
    def current(cls) -> DegradationSettings:
        return cls.objects.order_by("id").first() or cls()
