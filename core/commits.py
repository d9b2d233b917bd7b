"""Work that follows a transaction's commit, collected once per transaction.

The caches (the chat's hot tier, the corpora a user may search) must hear a change only once it
has committed: before that, a reader would refill them from the old rows, and a rolled-back
change must not reach them at all. A transaction that deletes a thousand rows should still cost
one Redis round trip, so the changes of one transaction are gathered in a batch per name and
applied together, once, after the commit.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

_ATTR = "_sluice_batch_{}"  # on the connection: the current transaction's batch of that name


def after_commit_collect(
    name: str,
    *,
    add: Callable[[dict], None],
    apply: Callable[[dict], None],
    empty: Callable[[], dict],
) -> None:
    """`add` records a change in the current transaction's batch `name` (`empty()` at first);
    `apply` receives the batch once, after commit. Outside a transaction, or in a Django
    TestCase's (which never commits: Django's durable blocks make the same exception), it is
    applied at once."""
    conn = transaction.get_connection()
    if not commit_pending():
        batch = empty()
        add(batch)
        apply(batch)
        return
    attr = _ATTR.format(name)
    batch = conn.__dict__.get(attr)
    # None yet, or its transaction was rolled back with its callback: a fresh batch.
    if not _registered(conn, batch):
        batch = empty()
        batch["_flush"] = lambda: apply(conn.__dict__.pop(attr, batch))
        conn.__dict__[attr] = batch
        # robust: a failure here is logged, and never reaches a caller whose write committed
        transaction.on_commit(batch["_flush"], robust=True)
    add(batch)


def after_commit(func: Callable[[], None]) -> None:
    """`func` once the current transaction commits (at once outside one, or in a Django
    TestCase's, as for `after_commit_collect`)."""
    if commit_pending():
        transaction.on_commit(func)
    else:
        func()


def commit_pending() -> bool:
    """Whether a write made now waits for a transaction's commit. A Django TestCase wraps each
    test in a transaction that never commits; Django marks it (`_from_testcase`, the mark its own
    durable blocks read), and writes inside it count as committed at once. The one place that
    reads the mark."""
    conn = transaction.get_connection()
    return conn.in_atomic_block and not conn.atomic_blocks[0]._from_testcase


def batch_pending(name: str) -> bool:
    """Whether the current transaction has collected changes under `name`."""
    conn = transaction.get_connection()
    return _registered(conn, conn.__dict__.get(_ATTR.format(name)))


def _registered(conn, batch: dict | None) -> bool:
    return (
        batch is not None
        and conn.in_atomic_block
        and any(entry[1] is batch["_flush"] for entry in conn.run_on_commit)
    )
