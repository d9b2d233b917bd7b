"""Reads for accounts."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.models import Tag, TagProposal, User


def tag_list_active() -> QuerySet[Tag]:
    return Tag.objects.filter(is_active=True)


def tag_proposals_open_for_user(*, user: User) -> QuerySet[TagProposal]:
    """Tags Sluice proposed from the user's questions, waiting for their yes or no."""
    return TagProposal.objects.filter(
        user=user, status=TagProposal.Status.PROPOSED, tag__is_active=True
    ).select_related("tag")
