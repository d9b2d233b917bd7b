from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from apps.ops import metrics as ops_metrics
from apps.ops import views as ops_views

admin.site.site_header = "Sluice admin"
admin.site.site_title = "Sluice"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("apps.accounts.urls")),
    path("health/", ops_views.health, name="health"),
    path("metrics", ops_metrics.metrics, name="metrics"),
    path("api/v1/", include("apps.chat.api_urls")),
    path("rag/", include("apps.rag.urls")),
    path("", include("apps.chat.urls")),
]
