"""Pages for a user's own chat data: search, archive, export and import."""

from __future__ import annotations

import json

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from apps.chat import selectors, services
from apps.chat.data import export, search

IMPORT_MAX_BYTES = 5 * 1024 * 1024


@login_required
@require_GET
def conversation_search(request: HttpRequest) -> HttpResponse:
    """The sidebar's search: the results in place for htmx, a page of its own without it."""
    query = request.GET.get("q", "")
    hits = search.conversation_search_for_user(user=request.user, query=query)
    context = {"query": query.strip(), "hits": hits}
    if request.htmx:
        return render(request, "chat/search.html#results", context)
    return render(request, "chat/search.html", context)


@login_required
@require_GET
def archived_list(request: HttpRequest) -> HttpResponse:
    conversations = selectors.conversation_list_for_user(user=request.user, archived=True)
    return render(request, "chat/archived.html", {"archived": conversations})


@login_required
@require_POST
def conversation_archive(request: HttpRequest, id: int) -> HttpResponse:
    """Archives (archived=1) or brings back (archived=0) one of the user's conversations: an
    archived chat leaves the sidebar's list but stays searchable and readable."""
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    archived = request.POST.get("archived", "1") == "1"
    services.conversation_set_archived(conversation=conversation, archived=archived)
    flash.success(request, "Chat archived." if archived else "Chat back in your list.")
    if archived:
        return redirect("chat:index")
    return redirect("chat:conversation", id=conversation.id)


def _download(body: str, *, filename: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@require_GET
def conversation_export(request: HttpRequest, id: int, fmt: str) -> HttpResponse:
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    name = slugify(conversation.title)[:50] or f"chat-{conversation.id}"
    if fmt == "md":
        body = export.conversation_export_markdown(conversation=conversation)
        return _download(body, filename=f"{name}.md", content_type="text/markdown; charset=utf-8")
    if fmt == "json":
        return _download(
            export.conversation_export_json(conversation=conversation),
            filename=f"{name}.json",
            content_type="application/json",
        )
    raise Http404


@login_required
@require_GET
def export_all(request: HttpRequest) -> HttpResponse:
    """Everything Sluice keeps about the user, as one JSON download."""
    data = export.user_export_all(user=request.user)
    response = JsonResponse(data, json_dumps_params={"indent": 2, "ensure_ascii": False})
    stamp = timezone.now().strftime("%Y%m%d")
    response["Content-Disposition"] = f'attachment; filename="sluice-{stamp}.json"'
    return response


@login_required
@require_POST
def conversation_import(request: HttpRequest) -> HttpResponse:
    """A conversation's JSON export, uploaded, becomes a new conversation of the user."""
    upload = request.FILES.get("file")
    try:
        if upload is None:
            raise ValidationError("Choose a conversation's JSON export to import.")
        if upload.size > IMPORT_MAX_BYTES:
            raise ValidationError("That file is too large to be a conversation export.")
        try:
            data = json.loads(upload.read().decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ValidationError("That file is not JSON.") from None
        conversation = export.conversation_import(owner=request.user, data=data)
    except ValidationError as exc:
        flash.error(request, " ".join(exc.messages))
        return redirect("chat:archived")
    flash.success(request, "Chat imported.")
    return redirect("chat:conversation", id=conversation.id)
