from __future__ import annotations

from django.urls import path

from apps.ops import reports

app_name = "reports"

urlpatterns = [
    path("answer/<int:message_id>/", reports.report_answer, name="answer"),
]
