"""Where users' files are ingested: one background thread per web process, started when a file
is accepted (after its commit) and whenever a page asks about a file still waiting, which
drains the table's queue and ends. The upload request answers at once; embedding a file runs
here, beside the query embeddings this process already computes with the same loaded model.
`manage.py ingest_user_files` drains the same queue from its own process, for an operator who
wants ingestion off the web machines.
"""

from __future__ import annotations

from apps.rag.user_files import user_files_ingest_pending
from core.drainers import Drainer

_drainer = Drainer("sluice-user-files", user_files_ingest_pending, what="ingesting users' files")


def ingest_soon() -> None:
    """Makes sure this process's ingestion thread runs (it finds the new file in the table)."""
    _drainer.soon()
