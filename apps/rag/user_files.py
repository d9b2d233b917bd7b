"""A user's own files: accepted from the chat's composer, ingested off the request path into the
user's private corpus by the same pipeline as the shared corpora, listed and deleted by them.

Accepting checks what is cheap to check (type, size, quota, readable text) and stores the bytes
with the entry; ingestion claims entries from the table (`FOR UPDATE SKIP LOCKED`, so any number
of processes may drain it) and writes its progress on the entry, which the page polls. An entry
whose ingestion stopped reporting (its process died) is claimed again after
RAG_USER_FILE_STALE_SECONDS. Who may search the private corpus is decided in the search's SQL
(selectors): its owner, nobody else.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from pathlib import PurePath

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.http import Http404
from django.utils import timezone

from apps.rag.ingestion import Ingestor
from apps.rag.models import Corpus, Document, UserFile
from apps.rag.services import document_delete

log = logging.getLogger("sluice.rag.user_files")

ACCEPTED = {
    ".pdf": "pdf",
    ".md": "md",
    ".markdown": "md",
    ".html": "html",
    ".htm": "html",
    ".txt": "txt",
}
ACCEPTED_HINT = "a PDF, Markdown, HTML or text file (.pdf, .md, .html, .txt)"


class FileRejected(Exception):
    """The file is not stored; `status` is the HTTP status to answer (400 or 413)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB".replace(".0 MB", " MB")


def clean_name(name: str) -> str:
    """The file's own name, without any folder a browser sent, at most 255 characters."""
    name = PurePath((name or "").replace("\\", "/")).name.strip()
    name = "".join(ch for ch in name if ch.isprintable())
    if not name:
        raise FileRejected("The file has no name.")
    stem, suffix = name[: -len(PurePath(name).suffix) or None], PurePath(name).suffix
    return stem[: 255 - len(suffix)] + suffix


def check_file(*, name: str, data: bytes) -> None:
    """Raises FileRejected for what can be told without parsing the file."""
    suffix = PurePath(name).suffix.lower()
    if suffix not in ACCEPTED:
        raise FileRejected(f"“{name}” is not {ACCEPTED_HINT}.")
    if len(data) > settings.RAG_USER_FILE_MAX_BYTES:
        raise FileRejected(
            f"“{name}” is {_megabytes(len(data))}; files may be at most "
            f"{_megabytes(settings.RAG_USER_FILE_MAX_BYTES)}.",
            status=413,
        )
    if not data.strip():
        raise FileRejected(f"“{name}” is empty.")
    if ACCEPTED[suffix] == "pdf":
        if b"%PDF-" not in data[:1024]:
            raise FileRejected(f"“{name}” is not a PDF (it does not start like one).")
        return
    if b"\x00" in data[:8192]:
        raise FileRejected(f"“{name}” is a binary file, not text.")
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise FileRejected(
            f"“{name}” is not UTF-8 text (byte {error.start}); save it as UTF-8 first."
        ) from None


def check_quota(*, owner, size: int) -> None:
    kept = UserFile.objects.filter(owner=owner).exclude(status=UserFile.Status.FAILED)
    if kept.count() >= settings.RAG_USER_FILES_MAX:
        raise FileRejected(
            f"You have {settings.RAG_USER_FILES_MAX} files already; delete one on your profile "
            "page first."
        )
    used = kept.aggregate(total=Sum("size"))["total"] or 0
    if used + size > settings.RAG_USER_FILES_MAX_TOTAL_BYTES:
        raise FileRejected(
            f"Your files would take {_megabytes(used + size)}, over your "
            f"{_megabytes(settings.RAG_USER_FILES_MAX_TOTAL_BYTES)}; delete some on your "
            "profile page first.",
            status=413,
        )


def private_corpus_for(*, owner) -> Corpus:
    corpus, _ = Corpus.objects.get_or_create(
        owner=owner,
        defaults={
            "name": f"user-{owner.pk}-files",
            "title": "Your files",
            "access": Corpus.Access.PRIVATE,
        },
    )
    return corpus


def user_file_accept(
    *, owner, name: str, data: bytes, conversation_id: int | None = None
) -> tuple[UserFile, bool]:
    """(entry, created): the file stored and queued for ingestion, or the entry of the same
    bytes the user attached before (not ingested twice). Raises FileRejected; a rejected file
    changes nothing. The caller starts ingestion after commit (`ingest_soon`)."""
    name = clean_name(name)
    check_file(name=name, data=data)
    checksum = hashlib.sha256(data).hexdigest()
    same = (
        UserFile.objects.filter(owner=owner, checksum=checksum)
        .exclude(status=UserFile.Status.FAILED)
        .defer("data")
        .first()
    )
    if same is not None:
        return same, False
    check_quota(owner=owner, size=len(data))
    entry = UserFile.objects.create(
        owner=owner,
        corpus=private_corpus_for(owner=owner),
        name=name,
        size=len(data),
        checksum=checksum,
        data=data,
        conversation_id=conversation_id,
    )
    return entry, True


# Ingestion -------------------------------------------------------------------------------------


# Readers a file may go quiet on (their process died or hung) before it is given up.
ATTEMPTS_MAX = 3


def user_file_claim_next() -> UserFile | None:
    """The oldest file waiting (or whose ingestion went quiet), marked as being read."""
    stale = timezone.now() - timedelta(seconds=settings.RAG_USER_FILE_STALE_SECONDS)
    waiting = Q(status=UserFile.Status.QUEUED) | Q(
        status=UserFile.Status.INGESTING, claimed_at__lt=stale
    )
    while True:
        with transaction.atomic():
            entry = (
                UserFile.objects.select_for_update(skip_locked=True)
                .filter(waiting)
                .order_by("created", "id")
                .first()
            )
            if entry is None:
                return None
            if entry.attempts >= ATTEMPTS_MAX:
                entry.status = UserFile.Status.FAILED
                entry.error = f"reading it stopped {entry.attempts} times; it may be damaged"
                entry.data = b""
                entry.save()
                continue
            entry.status = UserFile.Status.INGESTING
            entry.claimed_at = timezone.now()
            entry.attempts += 1
            entry.chunks_done = entry.chunks_total = 0
            entry.error = ""
            entry.save(
                update_fields=[
                    "status",
                    "claimed_at",
                    "attempts",
                    "chunks_done",
                    "chunks_total",
                    "error",
                    "updated",
                ]
            )
        return entry


def _report_progress(entry_id: int, done: int, total: int) -> None:
    # claimed_at doubles as the heartbeat: a file still being embedded is never taken as stale.
    UserFile.objects.filter(pk=entry_id, status=UserFile.Status.INGESTING).update(
        chunks_done=done, chunks_total=total, claimed_at=timezone.now(), updated=timezone.now()
    )


def user_file_ingest(*, entry: UserFile) -> UserFile:
    """Runs the pipeline on a claimed entry: its document in the private corpus, or its error."""
    ingestor = Ingestor(
        entry.corpus, on_embedded=lambda done, total: _report_progress(entry.pk, done, total)
    )
    source = f"files/{entry.pk}/{entry.name}"
    try:
        ingestor.add_bytes(source=source, data=bytes(entry.data))
        report = ingestor.finish()
    except Exception as error:  # never leaves the entry "reading" for ever
        log.exception("ingesting user file %s failed", entry.pk)
        report = None
        failure = f"could not be read ({error.__class__.__name__})"
    else:
        failure = "; ".join(reason for _, reason in report.failed)
    with transaction.atomic():
        current = UserFile.objects.select_for_update().filter(pk=entry.pk).first()
        document = Document.objects.filter(corpus=entry.corpus, source=source).first()
        if current is None:  # deleted while it was read: its passages go too
            if document is not None:
                document_delete(document=document)
            return entry
        if failure or document is None:
            current.status = UserFile.Status.FAILED
            current.error = failure or "no text could be read from it"
        else:
            current.status = UserFile.Status.READY
            current.document = document
            current.chunks_done = current.chunks_total = document.chunk_count
        current.data = b""  # the document holds the text now (or there is none to hold)
        current.save()
    return current


def user_files_ingest_pending(*, limit: int | None = None) -> int:
    """Ingests waiting files until none is left (or `limit`); how many it ingested."""
    count = 0
    while limit is None or count < limit:
        entry = user_file_claim_next()
        if entry is None:
            break
        user_file_ingest(entry=entry)
        count += 1
    return count


# Reads and deletion ----------------------------------------------------------------------------


def user_file_list_for_user(*, user):
    return UserFile.objects.filter(owner=user).defer("data")


def user_file_get_for_user(*, user, file_id: int) -> UserFile:
    try:
        return user_file_list_for_user(user=user).get(pk=file_id)
    except (UserFile.DoesNotExist, ValueError, TypeError):
        raise Http404("No such file.") from None


@transaction.atomic
def user_file_delete(*, entry: UserFile) -> None:
    """The entry, its document and every chunk and embedding of it."""
    document = Document.objects.filter(pk=entry.document_id).first()
    UserFile.objects.filter(pk=entry.pk).delete()
    if document is not None:
        document_delete(document=document)


def user_file_state(entry: UserFile) -> dict:
    """What the page shows: the entry's state in words and numbers (JSON)."""
    if entry.status == UserFile.Status.QUEUED:
        progress = "Waiting to be read…"
    elif entry.status == UserFile.Status.INGESTING:
        progress = (
            f"Reading… {entry.chunks_done} of {entry.chunks_total} passages"
            if entry.chunks_total
            else "Reading…"
        )
    elif entry.status == UserFile.Status.READY:
        count = f"{entry.chunks_total} passage{'' if entry.chunks_total == 1 else 's'}"
        progress = f"Ready ({count}): searched with your questions."
    else:
        progress = f"Could not be used: {entry.error}"
    return {
        "id": entry.pk,
        "name": entry.name,
        "size": entry.size,
        "status": entry.status,
        "done": entry.status in (UserFile.Status.READY, UserFile.Status.FAILED),
        "chunks_done": entry.chunks_done,
        "chunks_total": entry.chunks_total,
        "error": entry.error,
        "progress": progress,
    }
