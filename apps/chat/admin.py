from __future__ import annotations

from django.contrib import admin

from .models import Conversation, Message


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
        "request_id",
        "completion_tokens",
        "created",
    )
    list_filter = ("role", "created")
    search_fields = ("text", "request_id", "conversation__title", "conversation__owner__username")
    list_select_related = ("conversation",)
    raw_id_fields = ("conversation",)

    @admin.display(description="text")
    def short_text(self, message: Message) -> str:
        return message.text[:80]
