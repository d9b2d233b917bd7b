"""The page's memory controls: pin or unpin a message (kept in every prompt)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from apps.chat import selectors
from apps.chat.prompt import memory


@login_required
@require_POST
def message_pin(request: HttpRequest, id: int, message_id: int) -> HttpResponse:
    """Pins (pinned=1) or unpins (pinned=0) one of the user's messages; 404 for anyone else's.
    memory.js asks for JSON; without JavaScript the form posts and the page reloads."""
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    value = request.POST.get("pinned", "")
    if value not in ("0", "1"):
        return JsonResponse({"error": "pinned must be 0 or 1."}, status=400)
    message = memory.message_set_pinned(
        conversation=conversation, message_id=message_id, pinned=value == "1"
    )
    if "application/json" in request.headers.get("Accept", ""):
        return JsonResponse({"id": message.id, "pinned": message.pinned})
    return redirect("chat:conversation", id=conversation.id)
