"""PostgreSQL frozen, and stopped then started again, while answers run: the answers finished
meanwhile are stored once it is back, and nothing accepted is lost or stuck."""

from __future__ import annotations

import pytest

from contract.protocol import TERMINAL_STATES
from tests.faults.conftest import Postgres, assert_every_request_ended, wait_until


@pytest.fixture
def postgres(transactional_db):
    server = Postgres()
    yield server
    server.thaw()  # whatever happened, the next test finds it running


def _answers_running(stack, api, ids) -> bool:
    return all(api.state(i) in ("streaming", "done") for i in ids)


def _wait_for_every_answer_to_end(stack, ids) -> None:
    """Every answer ends (the workers say so in Redis) while the database cannot take it."""
    wait_until(
        lambda: all(state in TERMINAL_STATES for state in stack.states(ids).values()),
        timeout=60,
        what="every answer to end while the database is away",
    )


def test_answers_finished_while_postgres_is_frozen_are_stored_when_it_thaws(
    stack, roomy_plan, make_api, postgres
):
    base = stack.up({"w1": 4})
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(4)]
    wait_until(lambda: _answers_running(stack, api, ids), what="answers running")
    postgres.freeze()
    try:
        _wait_for_every_answer_to_end(stack, ids)
    finally:
        postgres.thaw()
    assert set(assert_every_request_ended(api, stack, ids).values()) == {"done"}


def test_answers_finished_while_postgres_is_down_are_stored_when_it_returns(
    stack, roomy_plan, make_api, postgres
):
    base = stack.up({"w1": 4})
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(4)]
    wait_until(lambda: _answers_running(stack, api, ids), what="answers running")
    postgres.stop()
    try:
        _wait_for_every_answer_to_end(stack, ids)
    finally:
        postgres.start()
    assert set(assert_every_request_ended(api, stack, ids).values()) == {"done"}
    more = [api.submit() for _ in range(2)]
    assert set(assert_every_request_ended(api, stack, more).values()) == {"done"}
