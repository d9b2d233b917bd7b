"""Where users' files are ingested: one background thread per web process, started when a file
is accepted (after its commit) and whenever a page asks about a file still waiting, which
drains the table's queue and ends. The upload request answers at once; embedding a file runs
here, beside the query embeddings this process already computes with the same loaded model.
`manage.py ingest_user_files` drains the same queue from its own process, for an operator who
wants ingestion off the web machines.
"""

from __future__ import annotations

import logging
import threading

from django.db import connections

from apps.rag.user_files import user_files_ingest_pending

log = logging.getLogger("sluice.rag.user_files")

_lock = threading.Lock()
_wanted = False  # set by every nudge; the thread drains once more before it ends
_thread: threading.Thread | None = None


def ingest_soon() -> None:
    """Makes sure this process's ingestion thread runs (it finds the new file in the table)."""
    global _thread, _wanted
    with _lock:
        _wanted = True
        if _thread is None:
            _thread = threading.Thread(target=_drain, name="sluice-user-files", daemon=True)
            _thread.start()


def _drain() -> None:
    global _thread, _wanted
    try:
        while True:
            with _lock:
                if not _wanted:
                    return
                _wanted = False
            try:
                user_files_ingest_pending()
            except Exception:  # the database away, say: the next nudge tries again
                log.exception("ingesting users' files failed")
    finally:
        with _lock:
            if _thread is threading.current_thread():
                _thread = None
        connections.close_all()  # this thread's connection goes back to the pool
