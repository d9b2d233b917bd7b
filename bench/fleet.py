"""Fleet benchmark: routing policies side by side on a simulated fleet, each through the real
dispatcher and real worker processes over Redis.

    .venv/bin/python bench/fleet.py                         # 8 workers, 4 policies, ~4 minutes
    .venv/bin/python bench/fleet.py --seconds 20 --workers 4 --policies affinity,round-robin

Policies (the dispatcher's SLUICE_ROUTING): round-robin push (what a plain load balancer in
front of GPU servers does: every request forwarded at once, in turn), least-loaded push, pull
without affinity, and Sluice's pull + affinity (+ the learned answer-length estimates, which
the dispatcher uses whenever apps/admission/estimates.py is there). The fleet and workload are
in bench/fleet_sim.py: N simulated workers with prefill per uncached prompt token, a prefix
cache with eviction, batch slowdown and one worker twice as slow; multi-turn conversations on
shared system prompts + passages, 70 % simple / 30 % complex, Poisson arrivals at --load x the
fleet's warm-cache capacity. Two cores run all of it, so keep the fleet's token rate modest:
--time-scale stretches every simulated GPU time (2: half as fast, half the tokens per second).

Per policy: answers/s completed in the measured window (after --warmup), TTFT p50/p99 and end
to end p99 from submission (a request with no first token by the end counts the time it has
waited), the prompt tokens the workers' prefix caches skipped, the workers' busy share (mean
running sequences per slot) and the load imbalance between workers: each worker's load is its
running answers plus the work queued on its own stream, per slot, sampled every 0.5 s; the
imbalance is (max - min) / mean of those averages.
Prints figures; asserts nothing. The last line is the one the issue asks for.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from fleet_sim import (  # noqa: E402
    MAX_TOKENS,
    Request,
    Workload,
    capacity,
    engine_figures,
    read_timings,
    worker_args,
    worker_loads,
)
from harness import median, percentile, setup_django  # noqa: E402

from devstack.stack import Supervisor, backing_services, manage, say  # noqa: E402

POLICIES = ("round-robin", "least-loaded", "pull", "affinity")


def prepare(users: int, conversations: int) -> list[tuple[int, int]]:
    """Users on a plan that admits everything, and conversations for them; the dispatcher never
    sheds load here (the benchmark compares routing, not degradation)."""
    from apps.accounts.models import User
    from apps.admission.models import DegradationSettings, Plan
    from apps.chat.models import Conversation

    Plan.objects.filter(is_default=True).update(
        requests_per_minute=1_000_000,
        burst_requests=1_000_000,
        tokens_per_minute=10**9,
        burst_tokens=10**9,
        tokens_per_day=2 * 10**9,
        max_concurrent=10_000,
        max_queue_wait_seconds=3600,
    )
    row = DegradationSettings.current()
    row.forced_level = 0
    row.save()
    owners = [User.objects.create(username=f"fleet{os.getpid()}-{i}") for i in range(users)]
    made = Conversation.objects.bulk_create(
        [Conversation(owner=owners[i % users], title=f"fleet {i}") for i in range(conversations)]
    )
    return [(c.id, c.owner_id) for c in made]


def run_policy(policy: str, args, env: dict[str, str], conversations) -> dict:
    import redis

    from worker import protocol, transitions
    from worker.protocol import Keys, WorkItem

    prefix = f"fleet-{policy}-{os.getpid()}"
    keys = Keys(prefix=prefix)
    client = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    env = dict(
        env,
        SLUICE_REDIS_PREFIX=prefix,
        SLUICE_ROUTING=policy,
        SLUICE_AFFINITY_MAX_LOAD=str(args.max_load),
    )
    supervisor = Supervisor(env=env)
    worker_ids = [f"fw{i}" for i in range(args.workers)]
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
                    "--heartbeat-interval",
                    "1",
                    "--grace",
                    "1",
                    *worker_args(i, slots=args.slots, time_scale=args.time_scale),
                ],
            )
        deadline = time.monotonic() + 60
        while client.zcard(keys.workers) < args.workers or not client.get(keys.lease):
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not start")
            time.sleep(0.2)
        rate = args.load * capacity(
            workers=args.workers, slots=args.slots, time_scale=args.time_scale
        )
        workload = Workload(
            conversation_ids=list(conversations),
            corpora=args.corpora,
            active=args.active,
            seed=args.seed,
        )
        requests, window, figures = drive(
            client, keys, workload, rate, args, worker_ids, protocol, transitions, WorkItem
        )
        read_timings(client, keys, requests)
        metrics = client.hgetall(keys.metrics)
    finally:
        supervisor.stop_all(grace=5)
        client.close()
    return summarise(policy, requests, window, figures, args, rate, metrics)


def drive(client, keys, workload, rate, args, worker_ids, protocol, transitions, WorkItem):
    """Submits Poisson arrivals for --seconds, following answers on the done stream so each
    conversation asks its next question after its answer; then waits out --drain."""
    rng = workload.random
    start = time.time()
    warm_at, end_at = start + args.warmup, start + args.seconds
    next_at = start + rng.expovariate(rate)
    last_done = "$"
    requests: list[Request] = []
    figures = {}
    pending = 0
    sample_at = warm_at
    while True:
        now = time.time()
        if warm_at <= now < end_at and now >= sample_at:
            sample_at = now + 0.5
            figures.setdefault("loads", []).append(
                worker_loads(client, keys, worker_ids, args.slots)
            )
        if "start" not in figures and now >= warm_at:
            figures["start"] = (now, engine_figures(client, keys, worker_ids))
        if "end" not in figures and now >= end_at:
            figures["end"] = (now, engine_figures(client, keys, worker_ids))
        if now >= end_at + args.drain or (now >= end_at and not workload.asked):
            break
        batch = client.xread({keys.done: last_done}, count=1000, block=20)
        for _, entries in batch or []:
            for entry_id, fields in entries:
                last_done = entry_id
                workload.answered(fields.get("id", ""))
                if fields.get("state") == "done":  # every answer, whenever it was asked
                    figures.setdefault("done_ms", []).append(int(entry_id.split("-")[0]))
        pipe = client.pipeline(transaction=False)
        while now < end_at and next_at <= now:
            next_at += rng.expovariate(rate)
            asked = workload.next_question()
            if asked is None:
                continue  # every conversation waits for an answer: this arrival is lost
            conversation, messages, tokens, _ = asked
            chars = sum(len(m["content"]) for m in messages)
            item = WorkItem(
                id=protocol.new_request_id(),
                user_id=str(conversation.user_id),
                conversation_id=str(conversation.id),
                messages=messages,
                max_tokens=MAX_TOKENS,
                kind="rag",
                prompt_tokens_estimate=chars // 4,
            )
            transitions.submitted(
                pipe,
                keys,
                item,
                citations=[],
                stream=keys.admit,
                submit_by_ms=protocol.now_ms() + 60_000,
            )
            workload.asked_as(item.id, conversation, messages, tokens)
            if now >= warm_at:
                requests.append(Request(item.id, protocol.now_ms()))
            pending += 1
        if pending:
            pipe.execute()
            pending = 0
    figures.setdefault("end", (time.time(), engine_figures(client, keys, worker_ids)))
    return requests, (warm_at, end_at), figures


def summarise(policy, requests, window, figures, args, rate, metrics) -> dict:
    warm_at, end_at = (int(t * 1000) for t in window)
    closed = int(time.time() * 1000)
    ttft = [(r.first_ms or closed) - r.submitted_ms for r in requests]
    e2e = [(r.final_ms or closed) - r.submitted_ms for r in requests]
    completed = [t for t in figures.get("done_ms", []) if warm_at <= t <= end_at]
    (t0, before), (t1, after) = figures["start"], figures["end"]
    occupancy, cached, prompt = [], 0.0, 0.0
    for worker_id, fig in after.items():
        old = before.get(worker_id, {})
        grew = {k: float(fig.get(k, 0)) - float(old.get(k, 0)) for k in fig}
        elapsed = grew.get("at_s", 0) or t1 - t0  # between the two heartbeats read
        occupancy.append(grew.get("slot_seconds", 0) / max(elapsed, 1e-9) / args.slots)
        cached += grew.get("prompt_tokens_cached", 0)
        prompt += grew.get("prompt_tokens", 0)
    mean_busy = sum(occupancy) / len(occupancy) if occupancy else 0.0
    samples = figures.get("loads") or [[0.0]]
    loads = [sum(column) / len(samples) for column in zip(*samples, strict=True)]
    mean_load = sum(loads) / len(loads)
    return {
        "policy": policy,
        "offered": rate,
        "submitted": len(requests),
        "answers_s": len(completed) / ((end_at - warm_at) / 1000),
        "ttft_p50": median(ttft),
        "ttft_p99": percentile(ttft, 99),
        "e2e_p99": percentile(e2e, 99),
        "hit": cached / prompt if prompt else 0.0,
        "busy": mean_busy,
        "imbalance": (max(loads) - min(loads)) / mean_load if mean_load else 0.0,
        "unfinished": sum(r.final_ms is None for r in requests),
        "estimate": metrics.get("gauge:estimate_median_ape"),
        "rule": metrics.get("gauge:estimate_rule_median_ape"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--workers", type=int, default=8)
    add("--slots", type=int, default=4, help="concurrent sequences per worker")
    add("--seconds", type=float, default=40, help="arrivals last this long per policy")
    add("--warmup", type=float, default=8, help="seconds not measured at the start")
    add("--drain", type=float, default=15, help="seconds to wait for answers after arrivals")
    add("--load", type=float, default=0.9, help="offered load / warm-cache capacity")
    add("--time-scale", type=float, default=1.0, help="stretch every simulated GPU time")
    add("--corpora", type=int, default=32, help="distinct system prompts + passages")
    add("--active", type=int, default=96, help="conversations open at once")
    add("--max-load", type=float, default=2.5, help="SLUICE_AFFINITY_MAX_LOAD")
    add("--policies", default=",".join(POLICIES))
    add("--seed", type=int, default=7)
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    var = BASE_DIR / "var" / "bench" / f"fleet-{os.getpid()}"
    rows = []
    try:
        with backing_services(var) as urls:
            env = dict(
                os.environ,
                **urls,
                DJANGO_SETTINGS_MODULE="chatsite.settings.dev",
                DEBUG="false",
                LOG_LEVEL="WARNING",
                RAG_WARM_UP="false",
            )
            os.environ.update(urls)
            manage(env, "migrate", "--no-input", "-v", "0")
            setup_django()
            per_policy = args.active * 3
            conversations = prepare(16, per_policy * len(policies))
            for n, policy in enumerate(policies):
                say(
                    f"policy {policy}: {args.workers} workers x {args.slots} slots, "
                    f"{args.seconds:.0f} s"
                )
                mine = conversations[n * per_policy : (n + 1) * per_policy]
                rows.append(run_policy(policy, args, env, mine))
    finally:
        shutil.rmtree(var, ignore_errors=True)
    report(rows, args)


def report(rows: list[dict], args) -> None:
    print(
        f"\nfleet: {args.workers} simulated workers x {args.slots} slots (worker 0 at half "
        f"speed), time scale {args.time_scale:g}, offered {rows[0]['offered']:.1f} req/s "
        f"({args.load:.0%} of warm capacity), "
        f"{args.seconds - args.warmup:.0f} s measured"
    )
    print(
        f"{'policy':<14}{'ans/s':>7}{'ttft p50':>10}{'ttft p99':>10}{'e2e p99':>10}"
        f"{'cache hit':>11}{'busy':>7}{'imbalance':>11}{'unfinished':>12}"
    )
    for r in rows:
        print(
            f"{r['policy']:<14}{r['answers_s']:>7.2f}{r['ttft_p50']:>8.0f}ms{r['ttft_p99']:>8.0f}ms"
            f"{r['e2e_p99']:>8.0f}ms{r['hit']:>10.0%} {r['busy']:>6.0%}{r['imbalance']:>10.0%} "
            f"{r['unfinished']:>6}/{r['submitted']}"
        )
    by = {r["policy"]: r for r in rows}
    best, base = by.get("affinity"), by.get("round-robin")
    if best is None or base is None:
        return
    estimate = best["estimate"]
    if estimate is not None:
        print(
            f"answer-length estimate: median error {float(estimate):.0%} learned, "
            f"{float(best['rule'] or 0):.0%} for the old rule (max_tokens)"
        )
    error = f"{float(estimate) * 100:.0f}" if estimate is not None else "n/a"
    print(
        f"fleet: pull+affinity {best['answers_s']:.2f} ans/s vs round-robin "
        f"{base['answers_s']:.2f} ({best['answers_s'] / max(base['answers_s'], 1e-9):.2f}x), "
        f"ttft p99 {best['ttft_p99']:.0f} vs {base['ttft_p99']:.0f} ms, "
        f"estimate error {error} %"
    )


if __name__ == "__main__":
    main()
