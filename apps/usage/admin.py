"""Model prices, edited in the admin; usage and feedback have their own pages under
/admin/ops/ (apps/ops/usage_views.py)."""

from __future__ import annotations

from django.contrib import admin

from apps.usage.models import ModelPrice


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = ("model", "prompt", "cached_prompt", "completion", "currency")
    search_fields = ("model",)
