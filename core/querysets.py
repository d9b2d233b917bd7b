"""Bulk writes that caches can hear.

Django sends no model signal for `QuerySet.update()` (nor for `bulk_update()`, which is built on
it) or `bulk_create()`, so a cache that follows `post_save` would keep what such a write changed
until its TTL. Models whose rows feed a cache (plans and users' plans, which the API callers
cache holds: apps/admission/callers.py) use `NotifyingQuerySet` as their manager; it sends:

- `pre_update(sender=model, queryset=qs, values=kwargs)` before the UPDATE runs, so a receiver
  can read which rows it touches (afterwards the filter may match other rows, or none);
- `post_bulk_create(sender=model, objs=created)` after the rows are inserted.

A receiver that reads the queryset costs one SELECT per bulk write; `save()` and `delete()`
(which already send signals) are unaffected. Raw SQL still sends nothing: its callers tell the
caches themselves.
"""

from __future__ import annotations

from django.db import models
from django.dispatch import Signal

pre_update = Signal()
post_bulk_create = Signal()


class NotifyingQuerySet(models.QuerySet):
    def update(self, **kwargs):
        pre_update.send(sender=self.model, queryset=self, values=kwargs)
        return super().update(**kwargs)

    update.alters_data = True

    def bulk_create(self, objs, *args, **kwargs):
        created = super().bulk_create(objs, *args, **kwargs)
        post_bulk_create.send(sender=self.model, objs=created)
        return created


NotifyingManager = models.Manager.from_queryset(NotifyingQuerySet)
