"""The request inspector: the whole timeline of a finished, a rejected and a timed-out request,
read from what the web, the dispatcher and a real worker wrote."""

from __future__ import annotations

import pytest

from apps.admission import outcomes
from apps.admission.models import Plan
from apps.ops.inspector import ended_reason, timeline
from tests.admission.conftest import roomy_plan
from tests.ops.helpers import final_event, submit, until

pytestmark = pytest.mark.django_db


def names(found) -> list[str]:
    return [step.name for step in found.steps]


@pytest.mark.django_db(transaction=True)  # the answer is stored at its own time, not the test's
def test_a_finished_request_shows_every_step_across_the_processes(
    make_dispatcher, start_worker, user
):
    start_worker(
        "w-inspect",
        engine="simulated",
        extra=["--sim-first-token-ms", "5", "--sim-decode-ms", "1", "--sim-tokens", "8"],
    )
    dispatcher = make_dispatcher(injected=False)
    until(lambda: dispatcher.fleet.refresh().workers, step=dispatcher.step)
    request_id = submit(user)
    until(lambda: final_event(request_id), step=dispatcher.step)
    found = until(
        lambda: (t := timeline(request_id)).message is not None and t, step=dispatcher.step
    )
    assert names(found) == [
        "submitted",
        "admitted",
        "dispatched",
        "started (attempt 1)",
        "first token",
        "finished (done)",
        "answer stored",
    ]
    by_name = {step.name: step for step in found.steps}
    assert by_name["dispatched"].detail.startswith("to the shared work stream")
    assert by_name["started (attempt 1)"].detail.startswith("on w-inspect")
    assert "8 tokens" in by_name["finished (done)"].detail
    assert [s.process for s in found.steps] == [
        "web",
        "dispatcher",
        "dispatcher",
        "worker",
        "worker",
        "worker",
        "recorder",
    ]
    assert all(
        s.since_previous_ms is not None and s.since_previous_ms >= 0 for s in found.steps[1:]
    )
    assert found.outcome == "done" and found.total_ms is not None


def test_a_rejected_request_says_which_limit_refused_it(make_dispatcher, user):
    Plan.objects.filter(slug="free").update(burst_tokens=500)
    too_large = submit(user, max_tokens=1000, prompt_tokens=600)
    make_dispatcher().step()
    found = timeline(too_large)
    assert names(found) == ["submitted", "rejected", "answer stored"]
    assert found.reason == "too_large" and found.outcome == "failed"
    assert found.steps[1].process == "dispatcher"


def test_a_request_over_its_plans_rate_says_which_bucket(make_dispatcher, user):
    roomy_plan(burst_requests=1, requests_per_minute=1)
    Plan.objects.filter(slug="free").update(max_queue_wait_seconds=1)
    submit(user)
    over_the_rate = submit(user)
    make_dispatcher().step()
    found = timeline(over_the_rate)
    assert names(found) == ["submitted", "rejected", "answer stored"]
    assert found.reason == "rate: req (requests per minute)"


def test_a_request_that_timed_out_in_line_shows_its_positions(make_dispatcher, user, clock):
    roomy_plan()
    Plan.objects.filter(slug="free").update(max_queue_wait_seconds=5)
    first, second = submit(user), submit(user)
    dispatcher = make_dispatcher()
    dispatcher.step()  # no worker: both wait, and hear their positions
    clock.now += 6
    dispatcher.step()
    found = timeline(second)
    assert names(found) == ["submitted", "admitted", "timed out in line", "answer stored"]
    assert found.reason == "no_worker"
    assert [place for _, place, _ in found.positions] == [2]
    assert "charged; #2 in line" in found.steps[1].detail
    assert timeline(first).positions[0][1] == 1


def test_an_unknown_request_is_not_found(db):
    assert not timeline("0" * 32).found and timeline("0" * 32).steps == []


@pytest.mark.parametrize(
    "reason, text",
    [
        ("shed", outcomes.shed(retry_after=90)),
        ("too_large", outcomes.too_large(tokens=900, limit=500)),
        ("no_worker", outcomes.timed_out(waited_s=75)),
        ("rate: tpd (tokens per day)", outcomes.rate_limited(bucket="tpd", wait_s=4000)),
        ("rate: tpm (tokens per minute)", outcomes.rate_limited(bucket="tpm", wait_s=3)),
        ("lost", outcomes.lost()),
    ],
)
def test_each_reason_is_read_back_from_what_the_user_was_told(reason, text):
    assert ended_reason(text) == reason


def test_the_inspector_page_is_for_staff(client_for, user, make_dispatcher):
    Plan.objects.filter(slug="free").update(burst_tokens=500)
    request_id = submit(user, max_tokens=1000, prompt_tokens=600)
    make_dispatcher().step()
    assert client_for(user).get(f"/admin/ops/request/{request_id}/").status_code == 302
    user.is_staff = True
    user.save()
    page = client_for(user).get(f"/admin/ops/request/{request_id}/").content.decode()
    assert "rejected" in page and "too_large" in page and request_id in page
    found = client_for(user).get("/admin/ops/request/", {"id": request_id})
    assert found.status_code == 302 and found.url.endswith(f"/admin/ops/request/{request_id}/")
