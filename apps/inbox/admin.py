from __future__ import annotations

from django.contrib import admin

from apps.inbox import services as inbox
from apps.inbox.models import Announcement


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
