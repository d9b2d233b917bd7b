from __future__ import annotations

from django.urls import path

from apps.api import rest as api
from apps.api import rest_usage

app_name = "api"

urlpatterns = [
    path("requests", api.request_create, name="request_create"),
    path("requests/<str:request_id>", api.request_detail, name="request_detail"),
    path("requests/<str:request_id>/events", api.request_events, name="request_events"),
    path("requests/<str:request_id>/cancel", api.request_cancel, name="request_cancel"),
    path("requests/<str:request_id>/feedback", rest_usage.feedback, name="request_feedback"),
    path("usage", rest_usage.usage, name="usage"),
]
