"""Abuse controls beside suspensions: people report an answer and it reaches the admin's queue
with its question (opened only with the read permission and a reason, shown as text); staff
see who the rate limits refuse most."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from apps.accounts.models import StaffRead
from apps.accounts.services import user_create
from apps.chat.services import conversation_create, message_create
from apps.ops.models import Report
from apps.usage.models import HourlyUsage

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"
ANSWER = "Mix bleach and <script>alert('x')</script> ammonia."


@pytest.fixture
def answered(user):
    conversation = conversation_create(owner=user, title="Cleaning")
    message_create(conversation=conversation, role="user", text="How do I clean the <b>tub</b>?")
    answer = message_create(conversation=conversation, role="assistant", text=ANSWER)
    return conversation, answer


def staff_with(*codenames: str):
    member = user_create(username="-".join(codenames)[:150], password=PASSWORD, is_staff=True)
    member.is_superuser = False
    member.save()
    member.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(member)
    return client


def test_a_person_reports_an_answer_and_it_reaches_the_queue(answered, client_for, user):
    conversation, answer = answered
    client = client_for(user)
    page = client.get(f"/report/answer/{answer.pk}/")
    assert page.status_code == 200 and "&lt;script&gt;" in page.content.decode()
    sent = client.post(
        f"/report/answer/{answer.pk}/", {"category": "harmful", "details": "Toxic gas!"}
    )
    assert sent["Location"] == f"/c/{conversation.pk}/"
    report = Report.objects.get()
    assert (report.reported_text, report.context) == (ANSWER, "How do I clean the <b>tub</b>?")
    assert (report.reporter, report.category, report.status) == (user, "harmful", "open")
    client.post(f"/report/answer/{answer.pk}/", {"category": "wrong"})  # twice: still one
    assert Report.objects.count() == 1
    assert "Report this answer" in client.get(f"/c/{conversation.pk}/").content.decode()


def test_someone_elses_answer_or_a_question_cannot_be_reported(answered, other_user, client_for):
    conversation, answer = answered
    question = conversation.messages.get(role="user")
    intruder = client_for(other_user)
    for message in (answer, question):
        assert intruder.get(f"/report/answer/{message.pk}/").status_code == 404
        assert (
            intruder.post(f"/report/answer/{message.pk}/", {"category": "other"}).status_code == 404
        )
    assert not Report.objects.exists()


def test_the_queue_opens_a_report_only_with_the_permission_and_a_reason(answered, user):
    _, answer = answered
    report = Report.objects.create(
        reporter=user,
        conversation_id=answer.conversation_id,
        message_id=answer.pk,
        reported_text=ANSWER,
        context="How do I clean the <b>tub</b>?",
        category="harmful",
    )
    url = f"/admin/ops/report/{report.pk}/change/"
    plain = staff_with("view_report", "change_report")
    assert plain.get(url).status_code == 403
    assert "bleach" not in plain.get("/admin/ops/report/").content.decode()

    reader = staff_with("read_others_conversations", "view_report", "change_report")
    asked = reader.get(url).content.decode()
    assert "Why do you need to read this?" in asked and "bleach" not in asked
    reader.post(url, {"staff_read_reason": "Reviewing the reported answer 1"})
    shown = reader.get(url).content.decode()
    assert "Mix bleach and &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in shown
    assert "<script>alert('x')" not in shown and "<b>tub</b>" not in shown
    assert StaffRead.objects.get().subject == "report"
    reader.post(
        "/admin/ops/report/",
        {"action": "mark_dismissed", "_selected_action": [report.pk]},
    )
    report.refresh_from_db()
    assert report.status == "dismissed" and report.handled_by is not None


def refusals(user, hour, *, reason: str, requests: int, outcome: str = "rejected") -> None:
    HourlyUsage.objects.create(
        hour=hour, user=user, kind="chat", outcome=outcome, reason=reason, requests=requests
    )


def test_staff_see_who_the_limits_refuse_most(user, other_user):
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    quiet = user_create(username="quiet", password=PASSWORD)
    refusals(user, hour, reason="rate_limited", requests=4)
    refusals(user, hour, reason="", requests=6, outcome="done")
    refusals(other_user, hour, reason="rate_limited", requests=30)
    refusals(other_user, hour - timedelta(hours=1), reason="too_large", requests=5)
    refusals(other_user, hour, reason="shed", requests=100)  # the service's doing, not ranked
    refusals(quiet, hour, reason="shed", requests=50)
    refusals(quiet, hour - timedelta(days=30), reason="rate_limited", requests=99)  # too old
    client = staff_with("view_hourlyusage")
    page = client.get("/admin/ops/refused/").content.decode()
    table = page[page.index('id="refused-most"') :]
    assert table.index("mallory") < table.index("alice")
    assert "quiet" not in table
    assert ">35<" in table and ">40 %<" in table  # alice: 4 of 10 asked
    assert f"/admin/accounts/suspension/add/?user={other_user.pk}" in page
    assert "quiet" in client.get("/admin/ops/refused/?days=60").content.decode()
    assert "a whole number" in client.get("/admin/ops/refused/?days=abc").content.decode()
    assert Client().get("/admin/ops/refused/").status_code == 302  # staff only
