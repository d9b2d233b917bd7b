"""`manage.py run_dispatcher`: admission control, the fair queue, dispatching to workers and the
completion recorder, in one loop. Run two or more: one holds the lease and works, the others
stand by and take over within a few seconds of it stopping."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections

from apps.admission.dispatcher import Dispatcher, Options
from apps.admission.keys import ACTIVE_CONSUMER
from apps.chat import recorder
from chatsite.redis_client import get_redis
from worker.protocol import Keys

log = logging.getLogger("sluice.dispatcher")


class CompletionPass:
    """Stores, each dispatcher pass, the answers that finished meanwhile.

    The lease holder records under one consumer name, so a new holder finds what the old one
    had read but not stored. Those records are re-read after each load of the dispatcher's
    state (a new lease, a Redis outage) and after a pass that failed; other passes only read
    new records, without waiting: one round trip when nothing finished.
    """

    def __init__(self) -> None:
        self._loads_seen: int | None = None

    def __call__(self, dispatcher: Dispatcher) -> int:
        recover = dispatcher.loads != self._loads_seen
        self._loads_seen = None  # until this pass has stored what it read
        handled = recorder.record_pending(
            consumer=ACTIVE_CONSUMER, block_ms=None, pending=recover,
            on_recorded=dispatcher.on_completions,
        )  # fmt: skip
        self._loads_seen = dispatcher.loads
        return handled


class Command(BaseCommand):
    help = "Run the dispatcher: admission, fair queue, dispatch to workers, answer recorder."

    def handle(self, *args, **options):
        stopping = {"now": False}

        def stop(signum, frame):
            stopping["now"] = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        dispatcher = Dispatcher(
            client=get_redis(),
            keys=Keys(prefix=settings.SLUICE_REDIS_PREFIX),
            options=Options(
                lease_ms=settings.SLUICE_DISPATCHER_LEASE_MS,
                batch=settings.SLUICE_ADMISSION_BATCH,
                prefetch=settings.SLUICE_ADMISSION_PREFETCH,
                quantum=settings.SLUICE_ADMISSION_QUANTUM,
            ),
            holder=f"{socket.gethostname()}-{os.getpid()}",
            on_completion_pass=CompletionPass(),
        )
        self.stdout.write("[sluice] dispatcher running (active when it holds the lease)")
        grouped = False
        while not stopping["now"]:
            try:
                if not grouped:
                    recorder.ensure_group()
                    grouped = True
                dispatcher.step()
                if not dispatcher.active:
                    time.sleep(0.5)  # standby: poll the lease
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
                # Nothing is lost: the queue lives in Redis and is reloaded when it returns.
                log.warning("Redis unavailable (%s); retrying in 1 s", exc)
                time.sleep(1)
            except DatabaseError as exc:
                log.warning("database unavailable (%s); retrying in 1 s", exc)
                close_old_connections()
                time.sleep(1)
        try:
            dispatcher.release_lease()
        except redis.RedisError:
            pass
