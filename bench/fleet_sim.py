"""bench/fleet.py --check: pull and affinity through the real dispatcher and real worker processes
(simulated engines with the model's timing and cache) over Redis, at one rate, on the same
workload, beside what bench/fleet_model.py says for that rate. The check holds the model to the
processes: release, heartbeats, stream reads and affinity entries as they really happen.

Every request is counted: done (its final event came), timed out (none by the end of the drain)
or dropped (a chat question found every conversation waiting for its answer).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from fleet_model import Fleet
from fleet_prompts import Workload, open_conversations
from harness import percentile

from devstack.stack import Supervisor, say


def worker_args(index: int, fleet: Fleet) -> list[str]:
    return [
        "--engine",
        "simulated",
        "--slots",
        str(fleet.slots),
        "--sim-first-token-ms",
        str(fleet.first_token_ms),
        "--sim-prefill-ms-per-token",
        str(fleet.prefill_ms),
        "--sim-decode-ms",
        str(fleet.decode_ms),
        "--sim-batch-slowdown",
        str(fleet.slowdown),
        "--sim-kv-tokens",
        str(fleet.kv_tokens),
        "--sim-speed",
        str(fleet.speed(index)),
    ]


def prepare(users: int, conversations: int, fleet: Fleet) -> tuple[list[int], list[int]]:
    """Users on the model's plan (bench/fleet_dispatch.model_plan): its limits on what runs at
    once, with rates and quotas that admit everything (the check compares routing and
    release, not admission), and conversations for them."""
    from fleet_dispatch import model_plan

    from apps.accounts.models import User
    from apps.admission.models import DegradationSettings, Plan
    from apps.chat.models import Conversation

    plan = model_plan(fleet.max_concurrent)
    Plan.objects.filter(is_default=True).update(
        requests_per_minute=1_000_000,
        burst_requests=1_000_000,
        tokens_per_minute=10**9,
        burst_tokens=10**9,
        tokens_per_day=2 * 10**9,
        max_concurrent=plan.max_concurrent,
        max_background_concurrent=plan.max_background_concurrent,
        max_queue_wait_seconds=3600,
    )
    row = DegradationSettings.current()
    row.forced_level = 0
    row.save()
    owners = User.objects.bulk_create(
        [User(username=f"fleet{os.getpid()}-{i}") for i in range(users)]
    )
    made = Conversation.objects.bulk_create(
        [Conversation(owner=owners[i % users], title=f"fleet {i}") for i in range(conversations)]
    )
    return [u.id for u in owners], [c.id for c in made]


def check(*, policies, fleet: Fleet, rate: float, args, env: dict, model_rows: list[dict]) -> None:
    """`env`: the backing services' (bench/fleet.py starts them and migrates)."""
    per = int(rate * (args.check_seconds + 30) + 400)
    # One database user per workload user (400 people, 24 API clients), as in the model.
    users, conversations = prepare(440, per * len(policies), fleet)
    rows = []
    for n, policy in enumerate(policies):
        say(f"check {policy}: {fleet.workers} workers at {rate:.2f} req/s")
        mine = conversations[n * per : (n + 1) * per]
        rows.append(run_policy(policy, fleet, rate, args, env, users, mine))
    model = {r["policy"]: r for r in model_rows}
    print(
        f"\ncheck: real dispatcher + {fleet.workers} worker processes at {rate:.2f} req/s, "
        f"{args.check_seconds:.0f} s, against the model at the same rate"
    )
    print(f"{'policy':<10}{'ttft p50':>16}{'ttft p99':>18}{'cache hit':>14}{'lost':>10}")
    for r in rows:
        m = model.get(r["policy"], {})
        print(
            f"{r['policy']:<10}{r['ttft_p50']:>7.0f} / {m.get('ttft_p50', 0):>4.0f}ms"
            f"{r['ttft_p99']:>8.0f} / {m.get('ttft_p99', 0):>5.0f}ms"
            f"{r['hit']:>7.0%} / {m.get('hit', 0):>3.0%}"
            f"{r['lost']:>5} / {m.get('timed_out', 0) + m.get('dropped', 0)}"
        )
    print("(real / model; lost: timed out + dropped)")


def run_policy(policy, fleet, rate, args, env, users, conversations) -> dict:
    import redis

    from contract.protocol import Keys

    prefix = f"fleet-{policy}-{os.getpid()}"
    keys = Keys(prefix=prefix)
    client = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    env = dict(
        env,
        SLUICE_REDIS_PREFIX=prefix,
        SLUICE_ROUTING=policy,
        SLUICE_AFFINITY_MAX_LOAD=str(fleet.max_load),
    )
    supervisor = Supervisor(env=env)
    worker_ids = [f"fw{i}" for i in range(fleet.workers)]
    try:
        supervisor.start("dispatcher", [sys.executable, "manage.py", "run_dispatcher"])
        for i, worker_id in enumerate(worker_ids):
            supervisor.start(
                f"worker-{i}",
                [
                    sys.executable,
                    "-m",
                    "worker",
                    "--worker-id",
                    worker_id,
                    "--prefix",
                    prefix,
                    "--redis-url",
                    env["REDIS_URL"],
                    *worker_args(i, fleet),
                ],
            )
        deadline = time.monotonic() + 60
        while client.zcard(keys.workers) < fleet.workers or not client.get(keys.lease):
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not start")
            time.sleep(0.2)
        found = drive(client, keys, fleet, rate, args, users, conversations, worker_ids)
        return {"policy": policy, **found}
    finally:
        supervisor.stop_all(grace=5)
        client.close()


def drive(client, keys, fleet, rate, args, users, conversations, worker_ids) -> dict:
    """Poisson arrivals for --check-seconds after a warm-up, following the done stream so a
    conversation asks its next question after its answer; then up to 60 s of drain."""
    from contract import protocol, transitions
    from contract.protocol import WorkItem

    rng = random.Random(args.seed)
    active = open_conversations(rate, args.think_s)
    workload = Workload(
        rng=random.Random(args.seed + 1), active=active, users=len(users), layout="question"
    )
    start = time.time()
    warm_at, end_at = (
        start + min(args.warmup, 20),
        start + min(args.warmup, 20) + args.check_seconds,
    )
    next_at, last_done = start + rng.expovariate(rate), "$"
    asked: dict[str, object] = {}
    measured: dict[str, int] = {}  # request id → submitted ms
    dropped, before = 0, None
    people: dict[str, int] = {}  # workload user → index into `users`
    while True:
        now = time.time()
        if before is None and now >= warm_at:
            before = engine_figures(client, keys, worker_ids)
        if now >= end_at + 60 or (now >= end_at and not asked):
            break
        for _, entries in client.xread({keys.done: last_done}, count=1000, block=20) or []:
            for entry_id, fields in entries:
                last_done = entry_id
                ask = asked.pop(fields.get("id", ""), None)
                if ask is not None:
                    workload.answered(ask)
        pipe = client.pipeline(transaction=False)
        while now < end_at and next_at <= now:
            next_at += rng.expovariate(rate)
            ask = workload.next()
            if ask is None:
                dropped += now >= warm_at
                continue
            for one in (ask, *workload.background):
                conversation = str(conversations[int(one.conversation)]) if one.conversation else ""
                user = users[people.setdefault(one.user, len(people)) % len(users)]
                item = WorkItem(
                    id=protocol.new_request_id(),
                    user_id=str(user),
                    conversation_id=conversation,
                    messages=one.messages,
                    max_tokens=512,
                    kind="background"
                    if one.kind == "background"
                    else "rag"
                    if conversation
                    else "api",
                    prompt_tokens_estimate=sum(len(m["content"]) for m in one.messages) // 4,
                )
                transitions.submitted(
                    pipe,
                    keys,
                    item,
                    citations=[],
                    stream=keys.admit,
                    submit_by_ms=protocol.now_ms() + 60_000,
                )
                asked[item.id] = one
                if one is ask and now >= warm_at:
                    measured[item.id] = protocol.now_ms()
            workload.background.clear()
        pipe.execute()
    after = engine_figures(client, keys, worker_ids)
    return summarise(client, keys, measured, dropped, before or {}, after)


def summarise(client, keys, measured, dropped, before, after) -> dict:
    """TTFT from submission: the final event's stream id (Redis's clock, this machine's) less
    the generation's duration plus its engine TTFT, both in the final event's usage."""
    pipe = client.pipeline(transaction=False)
    ids = list(measured)
    for request_id in ids:
        pipe.xrevrange(keys.output(request_id), count=1)
    ttft, lost = [], 0
    for request_id, tail in zip(ids, pipe.execute(), strict=True):
        usage = json.loads(tail[0][1].get("usage") or "{}") if tail else {}
        if not tail or tail[0][1].get("type") != "final" or usage.get("ttft_ms") is None:
            lost += 1
            ttft.append(float("inf"))
            continue
        final_ms = int(tail[0][0].split("-")[0])
        first = final_ms - usage.get("duration_ms", 0) + usage["ttft_ms"]
        ttft.append(first - measured[request_id])
    cached = sum(
        float(f.get("prompt_tokens_cached", 0))
        - float(before.get(w, {}).get("prompt_tokens_cached", 0))
        for w, f in after.items()
    )
    prompt = sum(
        float(f.get("prompt_tokens", 0)) - float(before.get(w, {}).get("prompt_tokens", 0))
        for w, f in after.items()
    )
    return {
        "ttft_p50": percentile(ttft, 50) if ttft else 0.0,
        "ttft_p99": percentile(ttft, 99) if ttft else 0.0,
        "hit": cached / prompt if prompt else 0.0,
        "lost": lost + dropped,
    }


def engine_figures(client, keys, worker_ids: list[str]) -> dict[str, dict]:
    """Each worker's engine figures from its last heartbeat."""
    raws = client.mget([keys.heartbeat(w) for w in worker_ids])
    return {
        w: (json.loads(raw).get("engine_metrics") or {}) if raw else {}
        for w, raw in zip(worker_ids, raws, strict=True)
    }
