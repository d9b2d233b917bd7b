"""The source view a citation links to: the document, with the cited passage highlighted."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.rag.selectors import chunk_get_for_user, document_get_for_user
from apps.rag.user_files import user_file_delete, user_file_get_for_user


@login_required
def chunk_source(request, chunk_id: int):
    chunk = chunk_get_for_user(user=request.user, chunk_id=chunk_id)
    content = chunk.document.content
    return render(
        request,
        "rag/source.html",
        {
            "document": chunk.document,
            "chunk": chunk,
            "before": content[: chunk.char_start],
            "passage": content[chunk.char_start : chunk.char_end],
            "after": content[chunk.char_end :],
        },
    )


@login_required
def document_source(request, document_id: int):
    document = document_get_for_user(user=request.user, document_id=document_id)
    return render(
        request,
        "rag/source.html",
        {"document": document, "chunk": None, "before": document.content},
    )


@login_required
@require_POST
def user_file_remove(request, file_id: int):
    """Deletes one of the user's own files, with its passages (from the profile page)."""
    entry = user_file_get_for_user(user=request.user, file_id=file_id)
    user_file_delete(entry=entry)
    messages.success(request, f"“{entry.name}” deleted.")
    return redirect("accounts:profile")
