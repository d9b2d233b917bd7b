"""A queue drained in the background: one thread per process, started by a nudge, that runs its
work until no nudge came during the last round, then ends and gives its database connection
back. Users' files and re-embedding each keep their queue in a table and drain it this way."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

log = logging.getLogger("sluice.drainers")


class Drainer:
    def __init__(self, name: str, work: Callable[[], object], *, what: str) -> None:
        self.name, self.work, self.what = name, work, what
        self._lock = threading.Lock()
        self._wanted = False  # set by every nudge; the thread drains once more before it ends
        self._thread: threading.Thread | None = None

    def soon(self) -> None:
        """Makes sure this process's thread runs (it finds the new work in the table)."""
        with self._lock:
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name=self.name, daemon=True)
                self._thread.start()

    def _drain(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._wanted:
                        return
                    self._wanted = False
                try:
                    self.work()
                except Exception:  # the database away, say: the next nudge tries again
                    log.exception("%s failed", self.what)
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
            connections.close_all()  # this thread's connection goes back to the pool
