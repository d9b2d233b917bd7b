"""Reads for accounts."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.models import StaffRead, Tag, TagProposal, User


def tag_list_active() -> QuerySet[Tag]:
    return Tag.objects.filter(is_active=True)


def tag_proposals_open_for_user(*, user: User) -> QuerySet[TagProposal]:
    """Tags Sluice proposed from the user's questions, waiting for their yes or no."""
    return TagProposal.objects.filter(
        user=user, status=TagProposal.Status.PROPOSED, tag__is_active=True
    ).select_related("tag")


def staff_reads_of_owner(*, user: User, limit: int = 200) -> QuerySet[StaffRead]:
    """When staff read what `user` wrote, and why: newest first (their privacy page)."""
    return StaffRead.objects.filter(owner_id=user.pk).order_by("-at", "-id")[:limit]
