"""Work that follows a transaction's commit, collected once per transaction.

A cache (the API callers', apps/admission/callers.py) must hear a change only once it has
committed: before that, a reader would refill it from the old rows, and a rolled-back change
must not reach it at all. A transaction that deletes a thousand rows should still cost one
Redis round trip (or one recount of a corpus), so the changes of one transaction are gathered
in a batch per name and applied together, once, after the commit.

Only Django's public transaction API is used (`on_commit`, `get_autocommit`): inside a test's
never-committed transaction (Django's `TestCase`) the work waits like any other, and a test that
wants to see it commits for real (`django_db(transaction=True)`) or captures the on-commit
callbacks (`django_capture_on_commit_callbacks(execute=True)`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from weakref import WeakKeyDictionary

from django.db import transaction

# Per database connection (each thread or task has its own): {name: batch} of its open
# transaction. Kept beside the connection, never on it: Django's objects stay as Django made them.
_BATCHES: WeakKeyDictionary = WeakKeyDictionary()


def after_commit_collect(
    name: str,
    *,
    add: Callable[[dict], None],
    apply: Callable[[dict], None],
    empty: Callable[[], dict],
) -> None:
    """`add` records a change in the current transaction's batch `name` (`empty()` at first);
    `apply` receives the batch once, after commit. Outside a transaction it is applied at once.

    Every change registers the batch's flush (a cheap call; the first one after the commit
    applies the batch, the rest find it gone), so a change made after a rolled-back savepoint
    is never left without a callback. Changes made inside that savepoint stay in the batch:
    every batch is a cache invalidation or a recount, which costs nothing wrong when applied
    without need."""
    batches = _open_batches(transaction.get_connection())
    if batches is None:
        batch = empty()
        add(batch)
        apply(batch)
        return
    if name not in batches:
        batches[name] = empty()
    add(batches[name])
    # The flush holds this transaction's dict itself: a look outside a transaction (one of the
    # callbacks writing again) may drop the connection's entry before every flush has run.
    # robust: a failure is logged, and never reaches a caller whose write committed.
    transaction.on_commit(partial(_flush, batches, name, apply), robust=True)


def after_commit(func: Callable[[], None]) -> None:
    """`func` once the current transaction commits (at once outside one)."""
    transaction.on_commit(func)


def commit_pending() -> bool:
    """Whether a write made now waits for a transaction's commit."""
    return not transaction.get_autocommit()


def _open_batches(conn) -> dict | None:
    """The batches of the connection's open transaction; None outside one. What is left from a
    transaction that ended without committing (rolled back) is dropped on the first look
    outside a transaction."""
    if not commit_pending():
        _BATCHES.pop(conn, None)
        return None
    return _BATCHES.setdefault(conn, {})


def _flush(batches: dict, name: str, apply: Callable[[dict], None]) -> None:
    batch = batches.pop(name, None)
    if batch is not None:
        apply(batch)
