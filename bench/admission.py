"""Admission benchmark: decisions per second through the real dispatcher path, against the
ceiling Redis itself reaches with the same Lua bucket script, measured in the same run.

    .venv/bin/python bench/admission.py                 # 50,000 requests from 1,000 users
    .venv/bin/python bench/admission.py --requests 20000
    .venv/bin/python bench/admission.py --cluster       # a local 3-master cluster, then one node

With --cluster the dispatcher runs against a local 3-master Redis Cluster (devstack/cluster.py):
its keys share one slot, so every decision lands on one master, and the ceiling is that
master's. The same run then repeats on one embedded Redis, and both figures print side by side.

Starts embedded PostgreSQL and Redis under var/bench/admission (or uses DATABASE_URL /
REDIS_URL). Steps:

1. dispatcher: N admission records (as the web writes them) are put on the admission stream,
   then `Dispatcher.step()` — the loop `manage.py run_dispatcher` runs — decides them: the plan
   lookup, the bucket script (one call per batch of 500), the queue written in one MULTI with
   the acknowledgements, the positions pushed to the waiting requests. No worker runs, so
   every request ends queued (or rejected where its user's buckets are empty).
2. ceiling: the same script, one decision per call, the commands encoded beforehand and sent
   pipelined on a raw socket, so only Redis is measured.
3. eta: the error of the queue ETAs positions.py tells, from measured per-model service times,
   beside the old single service time (the simulation of bench/estimates.py).

The embedded Redis keeps its append-only file on, but its automatic rewrite is held off during
the run and the file compacted before and after (see quiet_append_only_file).

Prints figures; asserts nothing. The last line is the one the issue asks for.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR)]

from devstack.stack import VAR_DIR, backing_services  # noqa: E402


def encode(*args) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def redis_ceiling(url: str, sha: str, keys: list[str], buckets, *, seconds: float) -> float:
    """Decisions/s Redis reaches running the script once per decision, pipelined 1,000 deep."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    args = ["", "take", len(buckets)]
    for bucket in buckets:
        args.extend(bucket.scaled())
    depth = 1000
    payload = b"".join(encode("EVALSHA", sha, 1, keys[i % len(keys)], *args) for i in range(depth))
    reply_size = len(b"*3\r\n:0\r\n:0\r\n:0\r\n")  # every decision is "taken" here
    sock = socket.create_connection((parsed.hostname, parsed.port or 6379))
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        sock.sendall(payload)
        need = reply_size * depth
        while need:
            chunk = sock.recv(min(need, 1 << 20))
            if not chunk:
                raise RuntimeError("Redis closed the connection")
            need -= len(chunk)
        done += depth
    elapsed = time.perf_counter() - started
    sock.close()
    return done / elapsed


def compact_append_only_file(client) -> None:
    """A run appends ~100 MB of commands to the embedded Redis's append-only file and then
    deletes its keys; unless rewritten, the file grows with every run until Redis takes longer
    to load it than the stack waits for it to start."""
    import redis

    try:
        client.bgrewriteaof()
    except redis.ResponseError:
        pass  # a rewrite is already running: wait for it
    while True:
        persistence = client.info("persistence")
        if not (
            persistence.get("aof_rewrite_in_progress") or persistence.get("aof_rewrite_scheduled")
        ):
            return
        time.sleep(0.05)


def quiet_append_only_file(client) -> None:
    """Compacts the embedded Redis's append-only file, then holds off its automatic rewrites
    for this run (the server is started for the run, so the setting ends with it). A rewrite
    forks a copy of Redis that takes one of the machine's cores for seconds, at a moment that
    depends on how big earlier runs left the file: it would land inside some measurements and
    not others. Every command is still appended to the file, as in production."""
    compact_append_only_file(client)
    client.config_set("auto-aof-rewrite-percentage", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="ceiling measurement time")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a local 3-master Redis Cluster, then on one Redis",
    )
    args = parser.parse_args()
    args.embedded_redis = not os.environ.get("REDIS_URL")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    if args.cluster:
        compare_with_cluster(args)
        return
    with backing_services(VAR_DIR / "bench" / "admission") as urls:
        os.environ.update(urls)
        os.environ["SLUICE_REDIS_PREFIX"] = "benchadm"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        run(args, urls["REDIS_URL"])


def compare_with_cluster(args) -> None:
    """The dispatcher on a cluster, then on one Redis, in this one run (two processes: Django's
    settings are read once per process)."""
    import subprocess
    import sys

    from devstack.cluster import local_cluster

    argv = [
        sys.executable,
        __file__,
        "--requests",
        str(args.requests),
        "--users",
        str(args.users),
        "--seconds",
        str(args.seconds),
    ]
    lines = {}
    with local_cluster(VAR_DIR / "bench" / "admission-cluster") as nodes:
        on_cluster = subprocess.run(
            argv,
            env=dict(os.environ, REDIS_URL=nodes.url),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        lines["cluster"] = _figures(on_cluster)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    one = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    lines["one node"] = _figures(one)
    for where, line in lines.items():
        print(f"{where}: {line}")


def _figures(output: str) -> str:
    return next(line for line in reversed(output.splitlines()) if line.startswith("admission:"))


def redis_client(redis_url: str):
    """A client of the one Redis or the cluster, and the URL of the node holding the
    dispatcher's slot (where the ceiling is measured)."""
    import redis

    from contract import cluster

    if not cluster.is_cluster_url(redis_url):
        return redis.Redis.from_url(redis_url, decode_responses=True), redis_url
    client = cluster.sync_client(
        redis_url, decode_responses=True, max_connections=4, timeout=10, connect_timeout=5
    )
    node = client.get_node_from_key("{adm}")
    return client, f"redis://{node.host}:{node.port}/0"


def run(args, redis_url: str) -> None:
    from apps.admission.buckets import SCRIPT, plan_buckets
    from apps.admission.dispatcher import Dispatcher, Options
    from apps.admission.models import DegradationSettings, Plan
    from bench.estimates import eta_errors
    from contract.protocol import Keys, WorkItem, new_request_id, now_ms

    client, ceiling_url = redis_client(redis_url)
    for key in client.scan_iter(match="benchadm:*", count=10_000):
        client.delete(key)
    if args.embedded_redis:
        quiet_append_only_file(client)
    # Generous limits: the figure is the decision path, not how often users are refused.
    Plan.objects.update_or_create(
        slug="bench",
        defaults=dict(
            name="Bench",
            is_default=True,
            requests_per_minute=100_000,
            burst_requests=100_000,
            tokens_per_minute=10_000_000,
            burst_tokens=10_000_000,
            tokens_per_day=100_000_000,
            max_queue_wait_seconds=3600,
        ),
    )
    Plan.objects.exclude(slug="bench").update(is_default=False)
    row = DegradationSettings.current()
    row.forced_level = 0  # this machine's CPU load must not shed the benchmark's requests
    row.save()

    keys = Keys(prefix="benchadm")
    messages = [{"role": "user", "content": "What does Sluice do when it is overloaded?"}]
    print(f"writing {args.requests} admission records from {args.users} users…", flush=True)
    pipe = client.pipeline(transaction=False)
    submit_by_ms = str(now_ms() + 3600_000)  # the web's deadline for Redis: not withdrawn here
    for i in range(args.requests):
        item = WorkItem(
            id=new_request_id(),
            user_id=str(i % args.users),
            conversation_id=str(i),
            messages=messages,
            max_tokens=256,
            prompt_tokens_estimate=40,
        )
        pipe.xadd(keys.admit, {**item.to_fields(), "submit_by_ms": submit_by_ms})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()

    dispatcher = Dispatcher(client=client, keys=keys, options=Options(block_ms=1))
    decided = 0
    started = time.perf_counter()
    while decided < args.requests:
        decided += dispatcher.step()
    elapsed = time.perf_counter() - started
    rate = decided / elapsed
    counters = client.hgetall(keys.metrics)
    print(
        f"dispatcher: {decided} decisions in {elapsed:.2f} s "
        f"({counters.get('requests:admitted', 0)} admitted, "
        f"{counters.get('requests:rejected', 0)} rejected, {len(dispatcher.line)} queued)"
    )

    plan = Plan.objects.get(slug="bench")
    buckets = plan_buckets(plan, tokens=296)
    sha = client.script_load(SCRIPT)
    bucket_keys = [keys.bucket(f"ceiling-{u}") for u in range(args.users)]
    ceiling = redis_ceiling(ceiling_url, sha, bucket_keys, buckets, seconds=args.seconds)
    print(f"redis: the bucket script once per decision, pipelined: {ceiling:,.0f}/s")
    for key in client.scan_iter(match="benchadm:*", count=10_000):
        client.delete(key)
    if args.embedded_redis:
        compact_append_only_file(client)  # the next run starts without loading this one's
    eta = eta_errors(argparse.Namespace(answers=5000, seed=1))
    print(
        f"eta: median |told - waited| / waited on two models of different speeds: "
        f"{eta['measured'] * 100:.0f} % from measured per-model service times, "
        f"{eta['rule'] * 100:.0f} % with one for all (bench/estimates.py)"
    )
    print(
        f"admission: {rate:.0f} decisions/s, redis ceiling {ceiling:.0f}/s, "
        f"ratio {rate / ceiling:.2f}"
    )


if __name__ == "__main__":
    main()
