"""Writes of usage and feedback.

Usage has one writer: the recorder, which calls `usage_record` with each batch of answer
records it reads from the done stream, in the transaction that stores those answers. Every
record counts once, whoever stored its answer (the recorder, or the web when the next question
came first) and however often it is delivered: the per-request row is unique on the request
id, and the hourly sums are added from the rows that statement inserted, never from the input.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, transaction
from django.utils import timezone

from apps.accounts.models import ApiKey, User
from apps.admission.models import Plan, UserPlan
from apps.rag.models import Chunk
from apps.usage.models import Feedback, HourlyUsage, Outcome, RequestUsage
from apps.usage.selectors import usage_row_get_for_user
from contract.protocol import Answer, State
from core.prepared import prepared_cursor

log = logging.getLogger("sluice.usage")

INT_MAX = 2_147_483_647
OUTCOME_OF_STATE = {
    State.DONE: Outcome.DONE,
    State.FAILED: Outcome.FAILED,
    State.CANCELLED: Outcome.CANCELLED,
}
COMMENT_MAX_CHARS = 2000


def _count(value) -> int:
    """A figure from a record, as a column takes it: a bad one counts as 0 rather than losing
    the whole answer's usage."""
    try:
        return min(max(int(value or 0), 0), INT_MAX)
    except (TypeError, ValueError):
        return 0


def usage_rows(
    answers: Sequence[Answer],
    requests: Sequence[dict[str, str | None]],
    passages: Sequence[list[int]],
    *,
    now_ms: int,
) -> list[dict]:
    """What `usage_record` stores for each answer: `requests` are the fields the recorder read
    of each request's hash (kind, created_ms, api_key), `passages` the chunk ids each answer
    cites."""
    rows = []
    for answer, fields, cited in zip(answers, requests, passages, strict=True):
        usage = answer.usage
        created_ms = _count(fields.get("created_ms"))
        wall_ms = now_ms - created_ms if created_ms else (usage.duration_ms or 0)
        # A refusal by admission carries its reason as a code; nothing ran for it.
        outcome = Outcome.REJECTED if answer.code else OUTCOME_OF_STATE[answer.state]
        rows.append(
            {
                "request_id": answer.id[:64],
                "user_id": int(answer.user_id),
                "conversation_id": int(answer.conversation_id or 0),
                "model": answer.model[:200],
                "kind": (fields.get("kind") or "chat")[:16],
                "outcome": str(outcome),
                "reason": answer.code[:32],
                "finish_reason": answer.finish_reason[:16],
                "prompt_tokens": _count(usage.prompt_tokens),
                "cached_tokens": _count(usage.cached_tokens),
                "completion_tokens": _count(usage.completion_tokens),
                "wall_ms": _count(wall_ms),
                "api_key": fields.get("api_key") or "",
                "passages": cited,
            }
        )
    return rows


_DIMENSIONS = "hour, user_id, plan_id, api_key_id, model, kind, outcome, reason"
_SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens", "wall_ms")


def _record_sql() -> str:
    # One statement: the rows that are new (a redelivered request inserts none) and, from
    # exactly those, the hourly sums. The plan is the user's as admission decides it (their
    # override, else the default plan); the key is found by the hash the web attached.
    # A user deleted meanwhile has nothing left to account to.
    raw, hourly = RequestUsage._meta.db_table, HourlyUsage._meta.db_table
    users, overrides = User._meta.db_table, UserPlan._meta.db_table
    plans, api_keys = Plan._meta.db_table, ApiKey._meta.db_table
    sums = ", ".join(f"sum({name})" for name in _SUMS)
    adds = ", ".join(f"{name} = h.{name} + excluded.{name}" for name in ("requests", *_SUMS))
    return f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%s::jsonb) AS r(
        request_id text, user_id bigint, conversation_id bigint, model text, kind text,
        outcome text, reason text, finish_reason text, prompt_tokens int, cached_tokens int,
        completion_tokens int, wall_ms int, api_key text, passages bigint[])
), new AS (
    INSERT INTO {raw} AS u (
        request_id, user_id, conversation_id, plan_id, api_key_id, model, kind, outcome,
        reason, finish_reason, prompt_tokens, cached_tokens, completion_tokens, wall_ms,
        passages, created, hour)
    SELECT r.request_id, r.user_id, r.conversation_id,
        coalesce((SELECT o.plan_id FROM {overrides} o WHERE o.user_id = r.user_id),
                 (SELECT p.id FROM {plans} p WHERE p.is_default ORDER BY p.id LIMIT 1), 0),
        coalesce((SELECT k.id FROM {api_keys} k
                  WHERE r.api_key <> '' AND k.key_hash = r.api_key), 0),
        r.model, r.kind, r.outcome, r.reason, r.finish_reason, r.prompt_tokens,
        r.cached_tokens, r.completion_tokens, r.wall_ms, r.passages,
        statement_timestamp(), date_trunc('hour', statement_timestamp())
    FROM input r JOIN {users} usr ON usr.id = r.user_id
    ORDER BY r.request_id
    ON CONFLICT (request_id) DO NOTHING
    RETURNING {_DIMENSIONS}, {", ".join(_SUMS)}
)
INSERT INTO {hourly} AS h ({_DIMENSIONS}, requests, {", ".join(_SUMS)})
SELECT {_DIMENSIONS}, count(*), {sums} FROM new
GROUP BY {_DIMENSIONS} ORDER BY {_DIMENSIONS}
ON CONFLICT ({_DIMENSIONS}) DO UPDATE SET {adds}
"""


_RECORD_SQL = _record_sql()


def usage_record(*, rows: list[dict]) -> None:
    """Adds the answers' usage: their rows, once each, and the hourly sums of the new ones.
    Sorted, so two recorders that overlap in a failover lock the sums in the same order."""
    if not rows:
        return
    rows = sorted(rows, key=lambda row: row["request_id"])
    with prepared_cursor() as cursor:
        cursor.execute(_RECORD_SQL, [orjson.dumps(rows).decode()])


def usage_record_alone(*, rows: list[dict]) -> None:
    """`usage_record` in a savepoint of the caller's transaction: a batch whose usage cannot
    be stored (its user deleted that instant) loses only its usage, never its answers."""
    try:
        with transaction.atomic():
            usage_record(rows=rows)
    except (IntegrityError, DataError) as exc:
        log.error("usage of %d answers not recorded: %s", len(rows), exc)


@dataclass
class RetentionResult:
    requests: int = 0
    hours: int = 0


def usage_retention_apply(*, now: datetime | None = None) -> RetentionResult:
    """Deletes per-request rows older than USAGE_REQUEST_DAYS and hourly sums older than
    USAGE_ROLLUP_DAYS (0: keep for ever)."""
    now = now or timezone.now()
    result = RetentionResult()
    if settings.USAGE_REQUEST_DAYS > 0:
        cutoff = now - timedelta(days=settings.USAGE_REQUEST_DAYS)
        result.requests, _ = RequestUsage.objects.filter(created__lt=cutoff).delete()
    if settings.USAGE_ROLLUP_DAYS > 0:
        cutoff = now - timedelta(days=settings.USAGE_ROLLUP_DAYS)
        result.hours, _ = HourlyUsage.objects.filter(hour__lt=cutoff).delete()
    return result


# -- feedback ---------------------------------------------------------------------------------

VOTES = {"up": Feedback.UP, "down": Feedback.DOWN}


def feedback_clean(*, vote, reasons, comment) -> tuple[int | None, list[str], str]:
    """The vote (None: take it back), reasons and comment, or ValidationError saying what is
    wrong with them."""
    if vote not in (*VOTES, None, ""):
        raise ValidationError('\'vote\' must be "up", "down" or null (take the vote back).')
    if reasons is None:
        reasons = []
    allowed = set(Feedback.Reason.values)
    if not isinstance(reasons, list) or not all(r in allowed for r in reasons):
        raise ValidationError(f"'reasons' must be a list of: {', '.join(sorted(allowed))}.")
    if comment is None:
        comment = ""
    if not isinstance(comment, str):
        raise ValidationError("'comment' must be a string.")
    comment = comment.strip()
    if len(comment) > COMMENT_MAX_CHARS:
        raise ValidationError(f"'comment' is at most {COMMENT_MAX_CHARS} characters.")
    return VOTES.get(vote or ""), sorted(set(reasons)), comment


def feedback_set(
    *,
    user: User,
    request_id: str,
    vote: int | None,
    reasons: Iterable[str] = (),
    comment: str = "",
) -> Feedback | None:
    """The user's vote on one of their answers, replacing any earlier one (None: taken back).
    Http404 for an answer that is not theirs or not recorded (yet, or any more)."""
    usage = usage_row_get_for_user(user=user, request_id=request_id)
    if vote is None:
        Feedback.objects.filter(user=user, request_id=usage.request_id).delete()
        return None
    corpora = sorted(
        set(Chunk.objects.filter(id__in=usage.passages).values_list("corpus_id", flat=True))
    )
    feedback, _ = Feedback.objects.update_or_create(
        user=user,
        request_id=usage.request_id,
        defaults={
            "conversation_id": usage.conversation_id,
            "vote": vote,
            # Reasons say what was wrong: they belong with a down-vote only.
            "reasons": list(reasons) if vote == Feedback.DOWN else [],
            "comment": comment,
            "model": usage.model,
            "plan_id": usage.plan_id,
            "kind": usage.kind,
            "finish_reason": usage.finish_reason,
            "prompt_tokens": usage.prompt_tokens,
            "passages": usage.passages,
            "corpora": corpora,
        },
    )
    return feedback


def feedback_erase(*, conversation_ids: Iterable[int]) -> int:
    """Deletes the feedback given on these conversations' answers (erase means gone)."""
    deleted, _ = Feedback.objects.filter(conversation_id__in=list(conversation_ids)).delete()
    return deleted
