from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from redis.exceptions import RedisError

from apps.admission import selectors as admission_selectors
from apps.chat import selectors, services, submission, tab_sync, turns
from apps.chat.models import Conversation
from apps.chat.prompt import memory


@dataclass
class ModelChoice:
    """The chat page's model picker: what the user may pick now, and what is picked."""

    names: list[str]  # served by a live worker and allowed by the user's plan
    default: str  # what "Default" means now ("" when no worker serves anything)
    current: str  # the conversation's choice ("": the default)

    @property
    def current_offline(self) -> bool:
        return bool(self.current) and self.current not in self.names


def model_choice(user, conversation: Conversation | None) -> ModelChoice | None:
    """None while the workers cannot be asked (Redis away): the page works without a picker."""
    plan = admission_selectors.plan_for_user(user=user)
    try:
        names = admission_selectors.models_for_plan(plan=plan)
        default = admission_selectors.model_default(plan=plan)
    except RedisError:
        return None
    return ModelChoice(names, default, conversation.model if conversation else "")


def _page_context(request: HttpRequest, conversation: Conversation | None, **extra) -> dict:
    # The answer in progress is read before the messages: an answer stored in between is then
    # among the messages, and is not shown a second time as in progress (the conversation is
    # released just after its answer is stored).
    active = submission.active_request_id(conversation=conversation) if conversation else None
    chat_messages = (
        list(selectors.message_list_for_conversation(conversation=conversation))
        if conversation
        else []
    )
    if active and any(m.request_id == active for m in chat_messages):
        active = None
    context = {
        "model_choice": model_choice(request.user, conversation) if conversation else None,
        "max_chars": settings.CHAT_MESSAGE_MAX_CHARS,
        "active_request": active,
        "conversations": selectors.conversation_list_for_user(user=request.user),
        "conversation": conversation,
        "chat_messages": chat_messages,
    }
    context.update(extra)
    return context


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    latest = selectors.conversation_list_for_user(user=request.user).first()
    if latest:
        return redirect("chat:conversation", id=latest.id)
    return render(request, "chat/page.html", _page_context(request, None))  # a new chat


@login_required
@require_GET
def conversation_detail(request: HttpRequest, id: int) -> HttpResponse:
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    return render(request, "chat/page.html", _page_context(request, conversation))


@login_required
@require_http_methods(["GET", "POST"])
def conversation_new(request: HttpRequest) -> HttpResponse:
    """A new chat: the composer, and no conversation until its first question is sent (then
    the conversation is created, named after the question, and its answer starts)."""
    if request.method == "GET":
        return render(request, "chat/page.html", _page_context(request, None))
    if "text" not in request.POST:
        return redirect("chat:new")  # a "New chat" button posted without a question
    text = request.POST["text"]
    try:
        submitted = turns.conversation_start(user=request.user, text=text)
    except submission.REFUSALS as exc:
        error = submission.refusal_of(exc).message
    else:
        return redirect("chat:conversation", id=submitted.conversation_id)
    return render(
        request, "chat/page.html", _page_context(request, None, composer_error=error, draft=text)
    )


@login_required
@require_POST
def conversation_rename(request: HttpRequest, id: int) -> HttpResponse:
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    try:
        services.conversation_rename(conversation=conversation, title=request.POST.get("title", ""))
        tab_sync.title_published(conversation=conversation)
    except ValidationError as error:
        flash.error(request, " ".join(error.messages))
    if request.htmx:
        return render(request, "chat/page.html#sidebar", _page_context(request, conversation))
    return redirect("chat:conversation", id=conversation.id)


@login_required
@require_POST
def conversation_model(request: HttpRequest, id: int) -> HttpResponse:
    """Picks the model the conversation's next answers come from: one a live worker serves and
    the user's plan allows, or "" for the default."""
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    model = request.POST.get("model", "").strip()
    choice = model_choice(request.user, conversation)
    if model and (choice is None or model not in choice.names):
        flash.error(request, f"The model {model!r} is not available right now.")
    else:
        services.conversation_set_model(conversation=conversation, model=model)
    return redirect("chat:conversation", id=conversation.id)


@login_required
@require_POST
def conversation_delete(request: HttpRequest, id: int) -> HttpResponse:
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    services.conversation_delete(conversation=conversation)
    tab_sync.deletion_published(owner_id=request.user.id, conversation_id=id)
    flash.success(request, "Chat deleted.")
    return redirect("chat:index")


@login_required
@require_POST
def message_send(request: HttpRequest, id: int) -> HttpResponse:
    """Stores the question and starts the answer: the send path without JavaScript (chat.js
    uses the websocket instead)."""
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    text = request.POST.get("text", "")
    error = None
    try:
        submission.request_submit(
            submission.Question(user=request.user, conversation=conversation, text=text)
        )
        text = ""
    except submission.REFUSALS as exc:
        error = submission.refusal_of(exc).message
    if request.htmx:
        context = _page_context(request, conversation, composer_error=error, draft=text)
        return render(request, "chat/page.html#conversation-pane", context)
    if error:
        flash.error(request, error)
    return redirect("chat:conversation", id=conversation.id)


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


@login_required
@require_POST
def memory_edit(request: HttpRequest, id: int) -> HttpResponse:
    """Corrects (action=save, with the new value) or deletes (action=delete, or an empty value)
    one entry of what the conversation remembers; 404 for anyone else's conversation. The page
    comes back with the note open, showing the memory the next prompt holds."""
    conversation = selectors.conversation_get_for_user(user=request.user, id=id)
    key = request.POST.get("key", "")
    value = "" if request.POST.get("action") == "delete" else request.POST.get("value", "")
    if not memory.memory_entry_edit(conversation=conversation, key=key, value=value.strip()):
        flash.error(request, "That memory entry is not there any more.")
    url = reverse("chat:conversation", args=[conversation.id])
    return redirect(f"{url}?memory=1#memory-note")
