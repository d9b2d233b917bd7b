"""Reads for the rest of Sluice: a user's plan, the models being served, and the degradation
level in force.

Retrieval (apps/rag) asks `retrieval_degraded()` before its expensive steps; the level itself is
computed by the dispatcher and published in Redis every few seconds. The models, and each one's
context window, come from the workers' heartbeats, read at most once a second per process.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from dataclasses import dataclass, field

import redis
from django.conf import settings

from apps.accounts.models import User
from apps.accounts.services import API_KEY_PREFIX, api_key_authenticate, api_key_hash
from apps.admission import callers
from apps.admission.degradation import Degradation
from apps.admission.models import Plan, UserPlan
from apps.admission.plans import model_choose, plan_decide
from apps.admission.release import LIVE_SECONDS, beat_model, parsed_heartbeats
from contract import capabilities, protocol
from core.redis_client import get_redis, keys

# How long a process trusts what it read of the fleet; a model it did not see is read again at
# once (a worker that has just started is served without waiting for this).
FLEET_CACHE_SECONDS = 1.0
# A model served this recently, and not now, exists: its request is a 503, not a 404.
KNOWN_MODEL_SECONDS = 24 * 3600


@dataclass(frozen=True)
class ModelFleet:
    live: dict[str, int]  # model → slots of its live, healthy, not draining workers
    known: dict[str, int]  # served within KNOWN_MODEL_SECONDS → when last announced (ms)
    read_at: float = 0.0
    # model → the smallest context window its live workers report (a request of that model
    # may run on any of them); a model whose workers report none is absent.
    context: dict[str, int] = field(default_factory=dict)
    # model → what every one of its live workers can serve (contract/capabilities.py)
    capabilities: dict[str, frozenset[str]] = field(default_factory=dict)


_fleets: dict[str, ModelFleet] = {}  # by key prefix (tests use one each)


def model_fleet(*, fresh: bool = False) -> ModelFleet:
    """The models live workers serve now (named ones: a worker that announces no model is
    reached only as the default)."""
    prefix = keys().prefix
    cached = _fleets.get(prefix)
    if not fresh and cached is not None and time.monotonic() - cached.read_at < FLEET_CACHE_SECONDS:
        return cached
    k, client = keys(), get_redis()
    pipe = client.pipeline(transaction=False)
    pipe.zrangebyscore(k.workers, time.time() - LIVE_SECONDS, "+inf")
    pipe.hgetall(k.models)
    ids, seen = pipe.execute()
    live: dict[str, int] = {}
    context: dict[str, int] = {}
    # (model, heartbeat) of every worker that may still read its model's work, unhealthy ones
    # too: one that recovers reads it without the web looking again.
    readers: list[tuple[str, dict]] = []
    for beat in parsed_heartbeats(client.mget([k.heartbeat(w) for w in ids]) if ids else []):
        model = beat_model(beat)
        if not beat.get("draining"):
            readers.append((model, beat))
        if model and beat.get("healthy", True) and not beat.get("draining"):
            live[model] = live.get(model, 0) + int(beat.get("slots") or 0)
        window = _int(beat.get("context_tokens"))
        if window > 0:  # absent from workers of older releases and engines that cannot know
            context[model] = min(window, context.get(model, window))
    now = protocol.now_ms()
    known = {m: _int(at) for m, at in seen.items() if _int(at) >= now - KNOWN_MODEL_SECONDS * 1000}
    for model in live:
        known.setdefault(model, now)
    fleet = _fleets[prefix] = ModelFleet(
        live, known, time.monotonic(), context, capabilities.of_models(readers)
    )
    return fleet


def model_context_tokens(*, model: str) -> int:
    """The context window, in tokens, that prompts for `model` are built to fit: the smallest
    its live workers report, else MODEL_CONTEXT_TOKENS. A request that names no model ("")
    runs on the configured default (SLUICE_DEFAULT_MODEL) when there is one; else on whichever
    live model the dispatcher picks (or a worker that announces none), so it gets the smallest
    window among them."""
    fleet, fallback = model_fleet(), settings.MODEL_CONTEXT_TOKENS
    if model or settings.SLUICE_DEFAULT_MODEL:
        return fleet.context.get(model or settings.SLUICE_DEFAULT_MODEL, fallback)
    windows = [fleet.context.get(m, fallback) for m in fleet.live]
    if "" in fleet.context:  # workers that announce no model, and report their window
        windows.append(fleet.context[""])
    return min(windows, default=fallback)


def model_capabilities(*, model: str) -> frozenset[str]:
    """What a request of `model` may ask beyond plain sampling: what all of its live workers
    announce (none when none is live)."""
    return model_fleet().capabilities.get(model, frozenset())


def models_for_plan(*, plan: Plan) -> list[str]:
    """The models the plan may use that a live worker serves now, by name."""
    return sorted(m for m in model_fleet().live if plan.allows(m))


def model_default(*, plan: Plan) -> str:
    """The model a request that names none runs on (see plans.model_choose)."""
    return model_choose(
        "", plan=plan, live=model_fleet().live, configured=settings.SLUICE_DEFAULT_MODEL
    )


MODEL_OK, MODEL_NOT_FOUND, MODEL_NO_WORKER = "ok", "not_found", "no_worker"


def model_status(*, model: str, plan: Plan) -> str:
    """MODEL_OK: served now and the plan allows it. MODEL_NO_WORKER: it exists (served
    lately, configured as the default, or listed by the plan) but no live worker serves it now.
    MODEL_NOT_FOUND: unknown, or not the plan's (the answer does not tell which)."""
    if not model or not plan.allows(model):
        return MODEL_NOT_FOUND
    fleet = model_fleet()
    if model not in fleet.live:
        fleet = model_fleet(fresh=True)
    if model in fleet.live:
        return MODEL_OK
    if (
        model in fleet.known
        or model == settings.SLUICE_DEFAULT_MODEL
        or (model in (plan.model_names or []))
    ):
        return MODEL_NO_WORKER
    return MODEL_NOT_FOUND


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@functools.cache
def _plans_sql() -> str:
    plans, overrides = Plan._meta.db_table, UserPlan._meta.db_table
    return (
        f"SELECT p.*, up.id IS NOT NULL AS mine FROM {plans} p "
        f"LEFT JOIN {overrides} up ON up.plan_id = p.id AND up.user_id = %s "
        "WHERE up.id IS NOT NULL OR p.is_default"
    )


def plan_for_user(*, user) -> Plan:
    """The user's plan (see plans.plan_decide), in one plain SQL statement: the override and
    the default plans fetched together (every API request asks)."""
    user_id = getattr(user, "pk", None) if user is not None else None
    plans = list(Plan.objects.raw(_plans_sql(), [user_id or 0]))
    override = next((plan for plan in plans if plan.mine), None)
    return plan_decide(override=override, defaults=[plan for plan in plans if plan.is_default])


@functools.cache
def _plans_column_sql() -> str:
    """The user `u`'s candidate plans (those `_plans_sql` reads) as one JSON column."""
    plans, overrides = Plan._meta.db_table, UserPlan._meta.db_table
    return f"""(
        SELECT coalesce(jsonb_agg(to_jsonb(p) || jsonb_build_object('mine', up.id IS NOT NULL)),
                        '[]'::jsonb)
        FROM {plans} p LEFT JOIN {overrides} up ON up.plan_id = p.id AND up.user_id = u.id
        WHERE up.id IS NOT NULL OR p.is_default
    ) AS candidate_plans"""


def api_key_caller(*, raw: str) -> tuple[User, Plan] | None:
    """The active user whose unrevoked API key this is, and their plan (as plan_for_user
    decides it): from the callers' cache (callers.py), else in one statement, as every API
    request asks for both. None for a bad key."""
    if not raw.startswith(API_KEY_PREFIX):
        return None
    found = callers.lookup(api_key_hash(raw))
    if found.hit is not None:
        user, rows = found.hit
    else:
        user = api_key_authenticate(raw=raw, also=_plans_column_sql())
        if user is None:
            return None
        rows = user.candidate_plans
        rows = json.loads(rows) if isinstance(rows, str) else rows
        callers.remember(found, user=user, plans=rows)
    plans = [_plan_from_json(row) for row in rows]
    override = next((plan for plan in plans if plan.mine), None)
    return user, plan_decide(override=override, defaults=[p for p in plans if p.is_default])


def _plan_from_json(row: dict) -> Plan:
    """A plan from its row as `to_jsonb` writes it, each value as its field reads it. A row
    cached by a release before a field existed (an upgrade in progress) reads its default."""
    fields = Plan._meta.concrete_fields
    values = [f.to_python(row[f.column]) if f.column in row else f.get_default() for f in fields]
    plan = Plan.from_db("default", [f.attname for f in fields], values)
    plan.mine = row["mine"]
    return plan


def degradation_get() -> Degradation:
    """The level in force and its effects; level 0 when no dispatcher publishes one (or Redis
    is unreachable: a web process then cannot submit anything anyway)."""
    try:
        return Degradation.from_json(get_redis().get(keys().degradation))
    except redis.RedisError:
        return Degradation()


def degradation_level() -> int:
    return degradation_get().level


def retrieval_degraded() -> bool:
    """True while the service sheds load: skip expensive retrieval steps (reranking, query
    expansion, large candidate pools) and answer from the cheap ones."""
    return degradation_get().skip_retrieval


def admission_counters() -> dict[str, str]:
    return get_redis().hgetall(keys().metrics)


def queue_depth() -> int:
    return get_redis().hlen(keys().queue)


@dataclass(frozen=True)
class EstimateFigures:
    """The answer-length estimator's recent error, as the dispatcher last wrote it, beside the
    old rule's (max_tokens reserved for every answer); None before any answer was learned."""

    samples: int = 0
    median_ape: float | None = None
    under_half: float | None = None
    rule_median_ape: float | None = None
    rule_under_half: float | None = None
    # model → (seconds from start to final, answers measured): what the queue ETAs use
    service: dict[str, tuple[float, int]] = field(default_factory=dict)


def estimate_figures(
    counters: dict[str, str] | None = None, *, service: bool = False
) -> EstimateFigures:
    """From the metrics hash (`counters`: already read, else read here); with `service`, the
    per-model service times too."""
    if counters is None:
        counters = admission_counters()
    times = {}
    if service:
        for model, value in get_redis().hgetall(keys().estimates("service")).items():
            seconds, _, count = value.partition(",")
            with contextlib.suppress(ValueError):
                times[model or "(default)"] = (float(seconds), int(count))

    def figure(name: str) -> float | None:
        try:
            return float(counters[f"gauge:estimate_{name}"])
        except (KeyError, TypeError, ValueError):
            return None

    return EstimateFigures(
        samples=int(figure("samples") or 0),
        median_ape=figure("median_ape"),
        under_half=figure("under_half"),
        rule_median_ape=figure("rule_median_ape"),
        rule_under_half=figure("rule_under_half"),
        service=dict(sorted(times.items())),
    )
