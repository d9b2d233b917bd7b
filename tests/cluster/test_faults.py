"""The fault suite's process faults, on the cluster: the same tests as tests/faults/, with their
`stack` served by the cluster instead of a single Redis of the test's own.

Chosen for what a cluster changes (every request's keys on some master, the dispatcher's and
the fleet's on one): workers killed mid-answer, paused or stopping (reclaim and hand-on across
the work streams), the standby dispatcher taking over a queue (the lease and the queue on one
slot), work that kills every worker it runs on (isolated, counted and dead-lettered while its
neighbours finish), malformed work and answer records (the dead-letter stream), and a web
process killed under live SSE readers (the per-master output hub, resumed on another process).

Left out: Redis killed or frozen (one node's faults; a master killed is test_failover.py),
PostgreSQL frozen or stopped (nothing of Redis differs there), the flood and rate-limit tests
(admission runs on the cluster from tests/admission; the two take half a minute).
"""

from __future__ import annotations

import pytest

from tests.faults.test_dispatcher import (
    test_a_malformed_answer_record_is_dead_lettered_and_admission_goes_on,
    test_the_standby_takes_over_a_queue_and_loses_nothing,
)
from tests.faults.test_web import (
    test_readers_of_a_killed_web_process_resume_elsewhere_without_gap_or_repeat,
)
from tests.faults.test_workers import (
    test_a_malformed_work_entry_is_dead_lettered_and_holds_up_nothing,
    test_a_paused_worker_is_replaced_and_on_resume_neither_crashes_nor_writes,
    test_a_stopping_worker_takes_no_new_work_and_hands_on_what_it_cannot_finish,
    test_a_worker_killed_mid_answer_is_replaced_and_each_answer_stored_once,
    test_an_answer_that_ran_beside_poison_is_rerun_alone_and_never_dead_lettered,
    test_work_that_kills_every_worker_fails_visibly_while_other_work_flows,
)

pytestmark = pytest.mark.slow

__all__ = [
    "test_a_malformed_answer_record_is_dead_lettered_and_admission_goes_on",
    "test_a_malformed_work_entry_is_dead_lettered_and_holds_up_nothing",
    "test_a_paused_worker_is_replaced_and_on_resume_neither_crashes_nor_writes",
    "test_a_stopping_worker_takes_no_new_work_and_hands_on_what_it_cannot_finish",
    "test_a_worker_killed_mid_answer_is_replaced_and_each_answer_stored_once",
    "test_an_answer_that_ran_beside_poison_is_rerun_alone_and_never_dead_lettered",
    "test_readers_of_a_killed_web_process_resume_elsewhere_without_gap_or_repeat",
    "test_the_standby_takes_over_a_queue_and_loses_nothing",
    "test_work_that_kills_every_worker_fails_visibly_while_other_work_flows",
]


@pytest.fixture
def stack(cluster_stack):
    """The fault tests' stage, its processes and its own checks on the session's cluster."""
    return cluster_stack
