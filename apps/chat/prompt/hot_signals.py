"""Keeps the hot tier (hot.py) in step with ORM writes anywhere in Sluice: a message edited,
pinned or deleted, a summary written, a profile or tag changed, a conversation deleted. The
hot path's own writes (services.message_store and messages_store, raw SQL) push their turns
directly and send no signals.

Each transaction's changes are collected and dropped once, after it commits: deleting a
conversation of a thousand messages is one Redis round trip, and no reader can refill the
cache from data that is about to be rolled back or is not yet visible.

`QuerySet.update()` and `bulk_create()` send no model signal: these models use the
NotifyingManager (core/querysets.py), whose `pre_update` and `post_bulk_create` are
heard here like saves of the rows they touch.
"""

from __future__ import annotations

from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

from apps.accounts.models import Profile, Tag
from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.prompt import hot
from core.commits import after_commit_collect
from core.querysets import post_bulk_create, pre_update


def _later(kind: str, ids) -> None:
    """Collects the change for the current transaction's commit (at once outside one)."""
    ids = set(ids)
    after_commit_collect(
        "hot",
        add=lambda batch: batch[kind].update(ids),
        apply=_apply,
        empty=lambda: {"conversations": set(), "profiles": set(), "dropped": set()},
    )


def _apply(batch: dict) -> None:
    dropped = batch.get("dropped", set())
    hot.conversations_drop(dropped)
    hot.conversations_forget(batch.get("conversations", set()) - dropped)
    hot.profiles_forget(batch.get("profiles", set()))


def _message_changed(sender, instance: Message, **kwargs) -> None:
    if kwargs.get("created") is not None and kwargs.get("raw"):
        return  # fixtures
    _later("conversations", [instance.conversation_id])


def _summary_changed(sender, instance: ConversationSummary, **kwargs) -> None:
    _later("conversations", [instance.conversation_id])


def _conversation_deleted(sender, instance: Conversation, **kwargs) -> None:
    _later("dropped", [instance.pk])


def _profile_changed(sender, instance: Profile, **kwargs) -> None:
    _later("profiles", [instance.user_id])


def _profile_tags_changed(sender, instance, action: str, reverse: bool, pk_set, **kwargs) -> None:
    if not action.startswith("post_"):
        return
    if not reverse:  # profile.tags changed
        _later("profiles", [instance.user_id])
    else:  # tag.profiles changed
        users = Profile.objects.filter(pk__in=pk_set or ()).values_list("user_id", flat=True)
        _later("profiles", list(users))


def _tag_changed(sender, instance: Tag, **kwargs) -> None:
    """A tag's hint or active flag is in the system prompt of everyone who has it."""
    _later("profiles", list(instance.profiles.values_list("user_id", flat=True)))


def _messages_updated(sender, queryset, values: dict, **kwargs) -> None:
    """Messages or summaries changed in bulk: their conversations (before the update, and
    any it moves them to)."""
    conversations = set(queryset.values_list("conversation_id", flat=True))
    moved = values.get("conversation_id", values.get("conversation"))
    if moved is not None:
        conversations.add(getattr(moved, "pk", moved))
    _later("conversations", conversations)


def _messages_created(sender, objs, **kwargs) -> None:
    _later("conversations", {obj.conversation_id for obj in objs})


def _profiles_updated(sender, queryset, values: dict, **kwargs) -> None:
    _later("profiles", list(queryset.values_list("user_id", flat=True)))


def _profiles_created(sender, objs, **kwargs) -> None:
    _later("profiles", [profile.user_id for profile in objs])


def _tags_updated(sender, queryset, values: dict, **kwargs) -> None:
    users = Profile.objects.filter(tags__in=queryset).values_list("user_id", flat=True)
    _later("profiles", list(users.distinct()))


def connect() -> None:
    post_save.connect(_message_changed, sender=Message, dispatch_uid="hot-message-save")
    post_delete.connect(_message_changed, sender=Message, dispatch_uid="hot-message-delete")
    post_save.connect(_summary_changed, sender=ConversationSummary, dispatch_uid="hot-summary")
    post_delete.connect(
        _summary_changed, sender=ConversationSummary, dispatch_uid="hot-summary-delete"
    )
    post_delete.connect(_conversation_deleted, sender=Conversation, dispatch_uid="hot-conv")
    post_save.connect(_profile_changed, sender=Profile, dispatch_uid="hot-profile")
    post_delete.connect(_profile_changed, sender=Profile, dispatch_uid="hot-profile-delete")
    m2m_changed.connect(
        _profile_tags_changed, sender=Profile.tags.through, dispatch_uid="hot-profile-tags"
    )
    post_save.connect(_tag_changed, sender=Tag, dispatch_uid="hot-tag")
    pre_delete.connect(_tag_changed, sender=Tag, dispatch_uid="hot-tag-delete")
    for model in (Message, ConversationSummary):
        pre_update.connect(
            _messages_updated, sender=model, dispatch_uid=f"hot-{model.__name__}-update"
        )
        post_bulk_create.connect(
            _messages_created, sender=model, dispatch_uid=f"hot-{model.__name__}-bulk"
        )
    pre_update.connect(_profiles_updated, sender=Profile, dispatch_uid="hot-profile-update")
    post_bulk_create.connect(_profiles_created, sender=Profile, dispatch_uid="hot-profile-bulk")
    pre_update.connect(_tags_updated, sender=Tag, dispatch_uid="hot-tag-update")
