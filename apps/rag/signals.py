"""Keeps the searchable-corpora cache (corpora_cache.py) true: every write that can change which
corpora a user may search drops the entries it makes wrong, wherever it is made (services,
the admin, a shell, a bulk QuerySet write).

What the answer depends on, and who hears it:
- a corpus's row (active, access, plans, counts, version, weights) and its groups: everybody,
  or only its owner for a private corpus;
- a user's groups, and their own plan (UserPlan): that user;
- plans (a slug, which one is the default) and groups deleted: everybody;
- a corpus's documents: deleting them (a queryset included) recounts the corpus's chunks once
  the transaction commits, and a corpus left with none is searched no more.

`QuerySet.update()` and `bulk_create()` send no model signal; Corpus, Plan and UserPlan use
the NotifyingManager (core/querysets.py) so those are heard too. Chunks are not
watched: a receiver on Chunk would make every cascade load each chunk (and its embedding) to
signal it; the corpus's counts speak for them.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models.signals import m2m_changed, post_delete, post_save

from apps.admission.models import Plan, UserPlan
from apps.rag import corpora_cache
from apps.rag.ingestion import corpus_refresh_counts
from apps.rag.models import Corpus, Document
from core.commits import after_commit_collect
from core.querysets import post_bulk_create, pre_update

# A plan's other fields (rates, quotas) do not choose corpora.
PLAN_FIELDS = {"slug", "is_default"}


def _corpora_changed(owner_ids) -> None:
    owners = set(owner_ids)
    corpora_cache.changed(shared=None in owners, users=owners - {None})


def _corpus_saved(sender, instance: Corpus, raw: bool = False, **kwargs) -> None:
    _corpora_changed([instance.owner_id])


def _corpus_updated(sender, queryset, values: dict, **kwargs) -> None:
    owners = set(queryset.values_list("owner_id", flat=True))
    if owners and ({"owner", "owner_id"} & values.keys()):
        owners.add(None)  # moved to another owner (or shared): everybody
    _corpora_changed(owners)


def _corpora_created(sender, objs, **kwargs) -> None:
    _corpora_changed([corpus.owner_id for corpus in objs])


def _corpus_groups_changed(sender, action: str, **kwargs) -> None:
    if action.startswith("post_"):
        corpora_cache.changed(shared=True)


def _user_groups_changed(sender, instance, action: str, reverse: bool, pk_set, **kwargs) -> None:
    if not reverse:  # user.groups.add(...) and friends
        if action.startswith("post_"):
            corpora_cache.changed(users=[instance.pk])
    elif action in ("post_add", "post_remove"):  # group.user_set.add(...)
        corpora_cache.changed(users=pk_set or ())
    elif action == "pre_clear":  # group.user_set.clear(): who is in it, before they leave
        corpora_cache.changed(users=list(instance.user_set.values_list("pk", flat=True)))


def _everybody(sender, **kwargs) -> None:
    corpora_cache.changed(shared=True)


def _plan_saved(sender, instance: Plan, update_fields=None, **kwargs) -> None:
    if update_fields is None or PLAN_FIELDS & set(update_fields):
        corpora_cache.changed(shared=True)


def _plans_updated(sender, queryset, values: dict, **kwargs) -> None:
    if PLAN_FIELDS & values.keys():
        corpora_cache.changed(shared=True)


def _user_plan_changed(sender, instance: UserPlan, **kwargs) -> None:
    corpora_cache.changed(users=[instance.user_id])


def _user_plans_updated(sender, queryset, values: dict, **kwargs) -> None:
    corpora_cache.changed(
        shared=bool({"user", "user_id"} & values.keys()),
        users=queryset.values_list("user_id", flat=True),
    )


def _user_plans_created(sender, objs, **kwargs) -> None:
    corpora_cache.changed(users=[override.user_id for override in objs])


def _document_deleted(sender, instance: Document, **kwargs) -> None:
    corpus_id = instance.corpus_id
    after_commit_collect(
        "recount",
        add=lambda batch: batch["corpora"].add(corpus_id),
        apply=_recount,
        empty=lambda: {"corpora": set()},
    )


def _recount(batch: dict) -> None:
    # The counts' own update (a QuerySet.update()) tells the cache, through _corpus_updated.
    for corpus_id in sorted(batch["corpora"]):
        corpus_refresh_counts(corpus_id=corpus_id)


def connect() -> None:
    user_groups = get_user_model().groups.through
    post_save.connect(_corpus_saved, sender=Corpus, dispatch_uid="corpora-corpus-save")
    post_delete.connect(_corpus_saved, sender=Corpus, dispatch_uid="corpora-corpus-delete")
    pre_update.connect(_corpus_updated, sender=Corpus, dispatch_uid="corpora-corpus-update")
    post_bulk_create.connect(_corpora_created, sender=Corpus, dispatch_uid="corpora-corpus-bulk")
    m2m_changed.connect(
        _corpus_groups_changed, sender=Corpus.groups.through, dispatch_uid="corpora-corpus-groups"
    )
    m2m_changed.connect(
        _user_groups_changed, sender=user_groups, dispatch_uid="corpora-user-groups"
    )
    post_delete.connect(_everybody, sender=Group, dispatch_uid="corpora-group-delete")
    post_save.connect(_plan_saved, sender=Plan, dispatch_uid="corpora-plan-save")
    post_delete.connect(_everybody, sender=Plan, dispatch_uid="corpora-plan-delete")
    pre_update.connect(_plans_updated, sender=Plan, dispatch_uid="corpora-plan-update")
    post_bulk_create.connect(_everybody, sender=Plan, dispatch_uid="corpora-plan-bulk")
    post_save.connect(_user_plan_changed, sender=UserPlan, dispatch_uid="corpora-userplan-save")
    post_delete.connect(_user_plan_changed, sender=UserPlan, dispatch_uid="corpora-userplan-delete")
    pre_update.connect(_user_plans_updated, sender=UserPlan, dispatch_uid="corpora-userplan-update")
    post_bulk_create.connect(
        _user_plans_created, sender=UserPlan, dispatch_uid="corpora-userplan-bulk"
    )
    post_delete.connect(_document_deleted, sender=Document, dispatch_uid="corpora-doc-delete")
