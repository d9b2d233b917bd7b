from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from apps.chat.models import Conversation, Message, RetentionPolicy


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "text", "request_id", "prompt_tokens", "completion_tokens", "created")
    readonly_fields = ("created",)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "message_count", "archived", "created", "updated")
    list_filter = ("archived", "created")
    search_fields = ("title", "owner__username")
    date_hierarchy = "created"
    list_select_related = ("owner",)
    inlines = [MessageInline]

    @admin.display(description="messages")
    def message_count(self, conversation: Conversation) -> int:
        return conversation.messages.count()


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "short_text",
        "role",
        "conversation",
        "request_timeline",
        "completion_tokens",
        "created",
    )
    list_filter = ("role", "created")
    search_fields = ("text", "request_id", "conversation__title", "conversation__owner__username")
    list_select_related = ("conversation",)
    raw_id_fields = ("conversation",)

    readonly_fields = ("request_timeline",)

    @admin.display(description="text")
    def short_text(self, message: Message) -> str:
        return message.text[:80]

    @admin.display(description="request", ordering="request_id")
    def request_timeline(self, message: Message) -> str:
        """The request id, linked to its timeline in the request inspector (apps/ops)."""
        if not message.request_id:
            return "-"
        return format_html(
            '<a href="{}">{}</a>',
            reverse("ops:request", args=[message.request_id]),
            message.request_id,
        )


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    """One row; `manage.py apply_retention` applies it."""

    list_display = ("__str__", "archive_after_days", "drop_detail_after_days", "keep_turns")

    def has_add_permission(self, request) -> bool:
        return not RetentionPolicy.objects.exists() and super().has_add_permission(request)
