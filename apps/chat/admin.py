"""Conversations and messages in the admin: listed without their words, opened only by staff
with the permission to read other people's conversations and a reason (apps/accounts/
read_gate.py), never edited here."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.urls import reverse
from django.utils.html import format_html

from apps.accounts import read_gate
from apps.chat.models import Conversation, MemoryWriter, Message, RetentionPolicy
from apps.chat.prompt import memory_writer


class ReasonedReadAdmin(admin.ModelAdmin):
    """Visible to staff who may read other people's conversations; each object opens (change,
    delete and history pages alike) only after the reason's form. Read-only: an operator reads
    or deletes a person's words, never rewrites them."""

    actions = None  # a bulk delete's confirmation page would list the objects' words

    def owner_of(self, obj):
        raise NotImplementedError

    def read_subject(self, obj) -> tuple[str, object, tuple]:
        """(subject, id, the grants that also open it)."""
        raise NotImplementedError

    def has_module_permission(self, request) -> bool:
        return read_gate.may_read_others(request.user)

    def has_view_permission(self, request, obj=None) -> bool:
        return read_gate.may_read_others(request.user)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return read_gate.may_read_others(request.user) and super().has_delete_permission(
            request, obj
        )

    def _gated(self, request, object_id):
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return None  # the admin's own answer for a missing object
        subject, subject_id, covered_by = self.read_subject(obj)
        return read_gate.gate(
            request,
            owner=self.owner_of(obj),
            subject=subject,
            subject_id=subject_id,
            what=f"{subject} {subject_id}",
            covered_by=covered_by,
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        read_gate.require_permission(request)
        return self._gated(request, object_id) or super().change_view(
            request, object_id, form_url, extra_context
        )

    def delete_view(self, request, object_id, extra_context=None):
        read_gate.require_permission(request)
        return self._gated(request, object_id) or super().delete_view(
            request, object_id, extra_context
        )

    def history_view(self, request, object_id, extra_context=None):
        read_gate.require_permission(request)
        return self._gated(request, object_id) or super().history_view(
            request, object_id, extra_context
        )


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "text", "request_id", "prompt_tokens", "completion_tokens", "created")
    readonly_fields = fields
    can_delete = False

    def has_view_permission(self, request, obj=None) -> bool:
        return read_gate.may_read_others(request.user)  # the conversation's page was gated

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Conversation)
class ConversationAdmin(ReasonedReadAdmin):
    # No title in the list, nor a search on it: a title is the person's first question.
    list_display = ("label", "owner", "message_count", "archived", "created", "updated")
    list_display_links = ("label",)
    list_filter = ("archived", "created")
    search_fields = ("owner__username",)
    date_hierarchy = "created"
    list_select_related = ("owner",)
    fields = ("owner", "title", "model", "archived", "created", "updated")
    readonly_fields = fields
    inlines = [MessageInline]

    def owner_of(self, conversation):
        return conversation.owner

    def read_subject(self, conversation):
        return "conversation", conversation.pk, ()

    @admin.display(description="conversation")
    def label(self, conversation: Conversation) -> str:
        return f"Conversation {conversation.pk}"

    @admin.display(description="messages")
    def message_count(self, conversation: Conversation) -> int:
        return conversation.messages.count()


@admin.register(Message)
class MessageAdmin(ReasonedReadAdmin):
    # No text in the list, nor a search on it (a search would answer what someone wrote).
    list_display = (
        "label",
        "role",
        "conversation_number",
        "owner",
        "request_timeline",
        "completion_tokens",
        "created",
    )
    list_display_links = ("label",)
    list_filter = ("role", "created")
    search_fields = ("request_id", "conversation__owner__username")
    list_select_related = ("conversation__owner",)
    fields = (
        "conversation",
        "role",
        "text",
        "status",
        "error",
        "request_timeline",
        "prompt_tokens",
        "completion_tokens",
        "created",
    )
    readonly_fields = fields

    def owner_of(self, message):
        return message.conversation.owner

    def read_subject(self, message):
        return "message", message.pk, (("conversation", message.conversation_id),)

    @admin.display(description="message")
    def label(self, message: Message) -> str:
        return f"Message {message.pk}"

    @admin.display(description="conversation", ordering="conversation_id")
    def conversation_number(self, message: Message) -> int:
        return message.conversation_id

    @admin.display(description="owner")
    def owner(self, message: Message) -> str:
        return message.conversation.owner.get_username()

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


@admin.register(MemoryWriter)
class MemoryWriterAdmin(admin.ModelAdmin):
    """Which models write memory themselves, each with the figures measured for it."""

    list_display = ("__str__", "writes_memory", "accuracy", "stale_shown", "measured_at")
    list_editable = ("writes_memory",)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        memory_writer.writers_forget()
