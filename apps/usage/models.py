"""What each answer used, by the hour, and what people said of it.

RequestUsage holds one row per answer (a redelivered record adds none: unique request id);
HourlyUsage sums them by hour, user, plan, model, kind, API key and outcome. Both are written
by the recorder alone, in one statement (services.usage_record), so the rollups always equal
the sum of the rows they were made from. Plans and API keys are kept as plain ids, not foreign
keys: a deleted plan or key must not rewrite or merge the rows of the hours it was used in.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models

KINDS = ("chat", "rag", "long", "background", "api")


class Outcome(models.TextChoices):
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # refused by admission before any model ran (`reason` says why)


class RequestUsage(models.Model):
    """One answer's usage, kept USAGE_REQUEST_DAYS (apply_retention)."""

    request_id = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    conversation_id = models.BigIntegerField(default=0, help_text="0: an API request.")
    plan_id = models.IntegerField(default=0, help_text="The user's plan when it was recorded.")
    api_key_id = models.IntegerField(default=0, help_text="0: not sent with an API key.")
    model = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=16)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.CharField(max_length=32, blank=True, help_text="Why it was rejected.")
    finish_reason = models.CharField(max_length=16, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    wall_ms = models.PositiveIntegerField(default=0, help_text="From submission to recorded.")
    passages = ArrayField(models.BigIntegerField(), default=list, blank=True)
    created = models.DateTimeField()
    hour = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["user", "created"]),
            models.Index(fields=["created"]),
        ]

    def __str__(self) -> str:
        return self.request_id


class HourlyUsage(models.Model):
    """Sums of RequestUsage by hour and dimension, kept USAGE_ROLLUP_DAYS."""

    hour = models.DateTimeField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    plan_id = models.IntegerField(default=0)
    api_key_id = models.IntegerField(default=0)
    model = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=16)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.CharField(max_length=32, blank=True)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    wall_ms = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "hour",
                    "user",
                    "plan_id",
                    "api_key_id",
                    "model",
                    "kind",
                    "outcome",
                    "reason",
                ],
                name="usage_hourly_one_row_per_dimension",
            )
        ]
        indexes = [models.Index(fields=["user", "hour"]), models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.model or '(default)'} {self.kind}"


class ModelPrice(models.Model):
    """An operator's price for a model, so usage reads as money (optional)."""

    per_million = [MinValueValidator(0)]
    model = models.CharField(max_length=200, unique=True, help_text="As workers announce it.")
    prompt = models.DecimalField(
        max_digits=12, decimal_places=4, validators=per_million, help_text="Per million tokens."
    )
    cached_prompt = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        validators=per_million,
        help_text="Per million prompt tokens served from the cache (empty: the prompt price).",
    )
    completion = models.DecimalField(
        max_digits=12, decimal_places=4, validators=per_million, help_text="Per million tokens."
    )
    currency = models.CharField(max_length=8, default="USD")

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return self.model


class Feedback(models.Model):
    """A person's vote on one answer, with what produced it (copied from its usage row when
    the vote is cast, so it outlives that row's retention). The comment is the person's own:
    it is exported and erased with their conversation."""

    class Reason(models.TextChoices):
        WRONG = "wrong"
        UNHELPFUL = "unhelpful"
        UNSAFE = "unsafe"
        BAD_SOURCES = "bad_sources", "bad sources"

    UP, DOWN = 1, -1

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request_id = models.CharField(max_length=64)
    conversation_id = models.BigIntegerField(default=0)
    vote = models.SmallIntegerField(choices=[(UP, "up"), (DOWN, "down")])
    reasons = ArrayField(models.CharField(max_length=16, choices=Reason.choices), default=list)
    comment = models.TextField(blank=True, max_length=2000)
    model = models.CharField(max_length=200, blank=True)
    plan_id = models.IntegerField(default=0)
    kind = models.CharField(max_length=16, blank=True)
    finish_reason = models.CharField(max_length=16, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    passages = ArrayField(models.BigIntegerField(), default=list, blank=True)
    corpora = ArrayField(models.BigIntegerField(), default=list, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "request_id"], name="feedback_one_per_answer")
        ]
        indexes = [models.Index(fields=["updated"]), models.Index(fields=["conversation_id"])]

    def __str__(self) -> str:
        return f"{'+' if self.vote == self.UP else '-'} {self.request_id}"
