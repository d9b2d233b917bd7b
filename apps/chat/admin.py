from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from . import inbox
from .models import Announcement, Conversation, Message, RetentionPolicy


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


@admin.register(Announcement)
class AnnouncementAdmin(admin.ModelAdmin):
    """Saving a new announcement sends it: into the inbox of every user (or one plan's users),
    shown at once in their open tabs. A sent one cannot be changed."""

    list_display = ("__str__", "plan", "recipients", "author", "created")
    list_filter = ("plan",)
    fields = ("text", "plan")

    def get_readonly_fields(self, request, obj=None):
        return ("text", "plan", "recipients", "author", "created") if obj else ()

    def get_fields(self, request, obj=None):
        return ("text", "plan", "recipients", "author", "created") if obj else self.fields

    def save_model(self, request, obj, form, change) -> None:
        if change:
            return  # sent already
        sent = inbox.announcement_send(text=obj.text, plan=obj.plan, author=request.user)
        obj.pk, obj.recipients, obj.created = sent.pk, sent.recipients, sent.created

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    """One row; `manage.py apply_retention` applies it."""

    list_display = ("__str__", "archive_after_days", "drop_detail_after_days", "keep_turns")

    def has_add_permission(self, request) -> bool:
        return not RetentionPolicy.objects.exists() and super().has_add_permission(request)
