"""Files attached in the composer: the upload (which answers at once; the file is read in the
background into the user's private corpus) and its progress, as JSON for static/js/attach.js."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from apps.chat import selectors
from apps.rag.models import UserFile
from apps.rag.user_files import (
    FileRejected,
    user_file_accept,
    user_file_get_for_user,
    user_file_state,
)
from apps.rag.user_files_runner import ingest_soon

# Room for the multipart envelope around the file itself.
ENVELOPE_BYTES = 64 * 1024


def _rejected(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@login_required
@require_POST
def attachment_upload(request: HttpRequest) -> JsonResponse:
    """202 with the file's state (200: the same bytes were attached before); 400 (type,
    empty, unreadable, too many files) or 413 (too large) with a sentence to show; a rejected
    file stores nothing. `conversation` (optional): the chat it was attached in, the user's
    own (else 404)."""
    limit = settings.RAG_USER_FILE_MAX_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit + ENVELOPE_BYTES:  # refused before the body is parsed
        return _rejected(
            f"The file is too large; files may be at most {limit // (1024 * 1024)} MB.", 413
        )
    conversation_id = None
    if request.POST.get("conversation"):
        try:
            conversation_id = int(request.POST["conversation"])
        except ValueError:
            return _rejected("Unknown chat.", 400)
        selectors.conversation_get_for_user(user=request.user, id=conversation_id)  # or 404
    upload = request.FILES.get("file")
    if upload is None:
        return _rejected("Choose a file to attach.", 400)
    if upload.size > limit:
        return _rejected(
            f"“{upload.name}” is too large; files may be at most {limit // (1024 * 1024)} MB.", 413
        )
    try:
        with transaction.atomic():
            entry, created = user_file_accept(
                owner=request.user,
                name=upload.name,
                data=upload.read(),
                conversation_id=conversation_id,
            )
            if entry.status == UserFile.Status.QUEUED:
                transaction.on_commit(ingest_soon)
    except FileRejected as error:
        return _rejected(str(error), error.status)
    state = user_file_state(entry)
    state["duplicate"] = not created
    return JsonResponse(state, status=202 if created else 200)


@login_required
@require_GET
def attachment_status(request: HttpRequest, file_id: int) -> JsonResponse:
    """The file's progress; a page asking about a file still waiting also nudges this process
    to ingest (so a file whose web process went away is picked up again)."""
    entry = user_file_get_for_user(user=request.user, file_id=file_id)
    if entry.status in (UserFile.Status.QUEUED, UserFile.Status.INGESTING):
        ingest_soon()
    return JsonResponse(user_file_state(entry))
