"""The admin's index links to the operations page and the request inspector."""

from __future__ import annotations

from django.contrib import admin

admin.site.index_template = "admin/ops/index.html"
