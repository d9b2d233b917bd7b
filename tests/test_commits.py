"""core.commits: work waits for the commit, is applied once per transaction, and never for a
transaction that rolled back. Real transactions (`transaction=True`): a TestCase's never commits."""

from __future__ import annotations

import pytest
from django.db import transaction

from core.commits import after_commit, after_commit_collect, commit_pending

pytestmark = pytest.mark.django_db(transaction=True)


def collect(applied: list, name: str, value) -> None:
    after_commit_collect(
        name,
        add=lambda batch: batch["values"].add(value),
        apply=lambda batch: applied.append(sorted(batch["values"])),
        empty=lambda: {"values": set()},
    )


def test_outside_a_transaction_work_is_done_at_once():
    applied, done = [], []
    assert not commit_pending()
    collect(applied, "t", 1)
    after_commit(lambda: done.append(1))
    assert applied == [[1]] and done == [1]


def test_a_transactions_changes_are_applied_once_together_after_its_commit():
    applied, done = [], []
    with transaction.atomic():
        assert commit_pending()
        for value in range(3):
            collect(applied, "t", value)
        after_commit(lambda: done.append(1))
        assert applied == [] and done == []
    assert applied == [[0, 1, 2]] and done == [1]


def test_a_rolled_back_transactions_changes_are_never_applied():
    applied = []
    with pytest.raises(RuntimeError), transaction.atomic():
        collect(applied, "t", 1)
        raise RuntimeError
    collect(applied, "t", 2)  # outside: at once, alone
    assert applied == [[2]]


def test_a_change_after_a_rolled_back_savepoint_is_still_applied():
    applied = []
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            collect(applied, "t", 1)  # its callback goes with the savepoint
            raise RuntimeError
        collect(applied, "t", 2)
    # the savepoint's change rides along: every batch is an invalidation, harmless twice
    assert applied == [[1, 2]]


def test_work_done_by_a_flush_cannot_lose_another_batch_of_the_same_commit():
    applied = []

    def first(batch):
        applied.append(("first", sorted(batch["values"])))
        collect(applied, "nested", 9)  # after the commit: applied at once

    with transaction.atomic():
        after_commit_collect(
            "a",
            add=lambda batch: batch["values"].add(1),
            apply=first,
            empty=lambda: {"values": set()},
        )
        collect(applied, "b", 2)
    assert applied == [("first", [1]), [9], [2]]
