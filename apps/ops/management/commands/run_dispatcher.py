"""`manage.py run_dispatcher`: admission control, the fair queue, dispatching to workers and the
answer recorder, in one loop. Run two or more: one holds the lease and works, the others stand
by and take over within a few seconds of it stopping.

This command composes two apps that do not know each other: the dispatcher (apps/admission)
and the answer recorder (apps/chat), which stores each finished answer and hands it to the
dispatcher to settle.
"""

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
from apps.chat import recorder
from apps.ops import dispatcher_metrics
from contract.gc_tuning import freeze_startup_objects
from contract.protocol import ACTIVE_CONSUMER
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.dispatcher")


class RecorderPass:
    """Stores, each dispatcher pass, the answers that finished meanwhile, and settles them.

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
            consumer=ACTIVE_CONSUMER,
            block_ms=None,
            pending=recover,
            on_recorded=dispatcher.settle,
        )
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
            keys=keys(),
            options=Options(
                lease_ms=settings.SLUICE_DISPATCHER_LEASE_MS,
                batch=settings.SLUICE_ADMISSION_BATCH,
                prefetch=settings.SLUICE_ADMISSION_PREFETCH,
                quantum=settings.SLUICE_ADMISSION_QUANTUM,
            ),
            holder=f"{socket.gethostname()}-{os.getpid()}",
            recorder_pass=RecorderPass(),
        )
        if settings.DISPATCHER_METRICS_PORT:
            dispatcher_metrics.serve(
                dispatcher, settings.DISPATCHER_METRICS_PORT, addr=settings.DISPATCHER_METRICS_ADDR
            )
        self.stdout.write("[sluice] dispatcher running (active when it holds the lease)")
        freeze_startup_objects()
        grouped = False
        while not stopping["now"]:
            # Bad data never reaches here (it is dead-lettered where it is read); what does is
            # an outage, waited out: the line lives in Redis and is reloaded when it returns.
            try:
                if not grouped:
                    recorder.ensure_group()
                    grouped = True
                dispatcher.step()
                if not dispatcher.active:
                    time.sleep(0.5)  # standby: poll the lease
            except redis.RedisError as exc:
                log.warning("Redis unavailable (%s); retrying in 1 s", exc)
                grouped = False  # a Redis restarted empty has lost the groups too
                time.sleep(1)
            except DatabaseError as exc:
                log.warning("database unavailable (%s); retrying in 1 s", exc)
                close_old_connections()
                time.sleep(1)
        try:
            dispatcher.release_lease()
        except redis.RedisError:
            pass
