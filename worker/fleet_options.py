"""The options every worker process takes, a chat worker (`python -m worker`) or a retrieval
one (`python -m worker embed`): where Redis is, who the worker is, how it beats, when it takes
over a dead worker's work, and its metrics port. Each also reads the environment variable named
in brackets in its help, so a container or a systemd unit needs no command line."""

from __future__ import annotations

import argparse
import os


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    add = parser.add_argument
    add(
        "--redis-url",
        default=env("REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="[REDIS_URL] where the work streams live",
    )
    add(
        "--prefix",
        default=env("SLUICE_REDIS_PREFIX", "sluice"),
        help="[SLUICE_REDIS_PREFIX] prefix of every Redis key",
    )
    add(
        "--worker-id",
        default=env("WORKER_ID"),
        help="[WORKER_ID] consumer name, unique per worker (default host-pid)",
    )
    add(
        "--claim-idle-ms",
        type=int,
        default=int(env("WORKER_CLAIM_IDLE_MS", 10_000)),
        help="[WORKER_CLAIM_IDLE_MS] take over a dead worker's work after it idles this long",
    )
    add(
        "--heartbeat-interval",
        type=float,
        default=float(env("WORKER_HEARTBEAT_SECONDS", 2.0)),
        help="[WORKER_HEARTBEAT_SECONDS] seconds between heartbeats (the key lives 3x this)",
    )
    add(
        "--metrics-port",
        type=int,
        default=int(env("WORKER_METRICS_PORT", 0)),
        help="[WORKER_METRICS_PORT] serve Prometheus metrics on this port (default 0: off; "
        "each worker on a machine needs a port of its own)",
    )
    add(
        "--metrics-addr",
        default=env("WORKER_METRICS_ADDR", "0.0.0.0"),
        help="[WORKER_METRICS_ADDR] address the metrics port listens on (default all)",
    )
