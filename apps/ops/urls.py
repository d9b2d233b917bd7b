"""The operations page and the request inspector, under /admin/ops/ (staff only)."""

from __future__ import annotations

from django.urls import path

from apps.ops import admin_views, refusals, usage_views

app_name = "ops"

urlpatterns = [
    path("", admin_views.page, name="page"),
    path("live/", admin_views.live, name="live"),
    path("request/", admin_views.request_view, name="inspect"),
    path("request/<str:request_id>/", admin_views.request_view, name="request"),
    path("request/<str:request_id>/text/", admin_views.request_text, name="request_text"),
    path("usage/", usage_views.usage_page, name="usage"),
    path("usage.csv", usage_views.usage_csv, name="usage_csv"),
    path("feedback/", usage_views.feedback_page, name="feedback"),
    path("refused/", refusals.refused_page, name="refused"),
    path("feedback.csv", usage_views.feedback_csv, name="feedback_csv"),
    path("dead/<str:entry_id>/<str:action>/", admin_views.dead_letter, name="dead_letter"),
]
