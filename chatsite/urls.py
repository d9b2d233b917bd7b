from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from apps.accounts import signin
from apps.ops import metrics as ops_metrics
from apps.ops import views as ops_views

admin.site.site_header = "Sluice admin"
admin.site.site_title = "Sluice"

# JSON under /api/, a page elsewhere; never Django's debug pages (core/errors.py).
handler400 = "core.errors.bad_request"
handler403 = "core.errors.permission_denied"
handler404 = "core.errors.not_found"
handler500 = "core.errors.server_error"

urlpatterns = [
    # Ahead of the admin's own: the site's sign-in (throttle, second factor, identity provider).
    path("admin/login/", signin.admin_login),
    path("admin/ops/", include("apps.ops.urls")),  # the operations page, staff only
    path("admin/", admin.site.urls),
    path("accounts/", include("apps.accounts.urls")),
    # django-allauth's pages under their own names; Sluice's above take the paths they share.
    path("accounts/", include("allauth.urls")),
    path("report/", include("apps.ops.report_urls")),  # people report answers to staff
    path("health/", ops_views.health, name="health"),
    path("metrics", ops_metrics.metrics, name="metrics"),
    path("api/v1/", include("apps.api.rest_urls")),
    path("v1/", include("apps.api.openai_urls")),  # the OpenAI-compatible API
    path("rag/", include("apps.rag.urls")),
    path("", include("apps.chat.urls")),
]
