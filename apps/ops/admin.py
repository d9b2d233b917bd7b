"""The admin's index links to the operations page and the request inspector; the queue of
reported answers."""

from __future__ import annotations

from django.contrib import admin

from apps.chat.admin import ReasonedReadAdmin
from apps.ops.models import Report
from apps.ops.reports import reports_close

admin.site.index_template = "admin/ops/index.html"


@admin.register(Report)
class ReportAdmin(ReasonedReadAdmin):
    """Reported answers, open ones first. The list shows what was reported and when, never the
    words; a report opens (its answer, question and the reporter's note, all escaped) as the
    reporter's conversations do: with the permission, a reason, and a record the reporter
    sees. Closing reports from the list needs no reading."""

    list_display = ("id", "created", "status", "category", "subject", "reporter", "model")
    list_filter = ("status", "category", "created")
    list_select_related = ("reporter",)
    search_fields = ("reporter__username",)
    fields = (
        "reporter",
        "category",
        "status",
        "created",
        "conversation_id",
        "message_id",
        "request_id",
        "model",
        "context",
        "reported_text",
        "details",
        "handled",
        "handled_by",
    )
    readonly_fields = fields
    actions = ["mark_actioned", "mark_dismissed"]

    def owner_of(self, obj):
        return obj.reporter

    def read_subject(self, obj):
        return "report", obj.pk, (("conversation", obj.conversation_id),)

    def has_change_permission(self, request, obj=None) -> bool:
        # Closing reports (the actions) is a change; the page itself stays read-only.
        return obj is None and super(ReasonedReadAdmin, self).has_change_permission(request)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Close: action taken", permissions=["change"])
    def mark_actioned(self, request, queryset):
        closed = reports_close(reports=queryset, status=Report.Status.ACTIONED, by=request.user)
        self.message_user(request, f"{closed} report(s) closed as actioned.")

    @admin.action(description="Close: dismissed", permissions=["change"])
    def mark_dismissed(self, request, queryset):
        closed = reports_close(reports=queryset, status=Report.Status.DISMISSED, by=request.user)
        self.message_user(request, f"{closed} report(s) dismissed.")
