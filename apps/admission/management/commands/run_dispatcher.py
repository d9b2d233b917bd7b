"""`manage.py run_dispatcher`: records finished answers in PostgreSQL (and runs admission)."""

from __future__ import annotations

import logging
import signal
import socket
import time

from django.core.management.base import BaseCommand
from redis.exceptions import ConnectionError as RedisConnectionError

from apps.chat import recorder

log = logging.getLogger("sluice.dispatcher")


class Command(BaseCommand):
    help = "Run the dispatcher: completion recorder (and admission control when enabled)."

    def handle(self, *args, **options):
        stopping = {"now": False}

        def stop(signum, frame):
            stopping["now"] = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        consumer = f"{socket.gethostname()}-dispatcher"
        recorder.ensure_group()
        self.stdout.write("[sluice] dispatcher running: recording finished answers")
        while not stopping["now"]:
            try:
                recorder.record_pending(consumer=consumer, block_ms=1000)
            except RedisConnectionError as exc:
                log.warning("Redis unavailable (%s); retrying", exc)
                time.sleep(1)
