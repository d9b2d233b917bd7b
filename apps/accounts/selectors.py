"""Reads for accounts."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import Tag


def tag_list_active() -> QuerySet[Tag]:
    return Tag.objects.filter(is_active=True)
