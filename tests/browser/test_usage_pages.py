"""The admin's usage and feedback pages and the profile's usage block in headless Chromium at
375 and 1280 px: axe finds nothing serious or critical, nothing overflows, and the figures an
admin tunes from are there.

The data is a week of a small team's use, stored the way production stores it: answers go
through the done stream and the recorder (which writes their usage and hourly sums), passages
through the real ingestion pipeline, votes through feedback_set. Only the clock is moved: each
sitting's rows are aged by its distance from now once recorded, as
tests/usage/test_user_admin.py ages its rows.

With SLUICE_SCREENSHOTS=docs the pages are also photographed for docs/usage.md:
`SLUICE_SCREENSHOTS=docs .venv/bin/python -m devstack.stack test tests/browser/test_usage_pages.py`.
"""

from __future__ import annotations

import json
import os
import random
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.db.models import F
from django.utils import timezone
from playwright.sync_api import expect

from apps.accounts.services import api_key_create, api_key_hash, user_create
from apps.admission.models import Plan
from apps.admission.services import plan_assign, plan_make_default
from apps.chat import recorder
from apps.chat.services import conversation_create, message_create
from apps.rag.models import Chunk
from apps.rag.services import corpus_get_or_create, corpus_ingest_paths
from apps.usage.models import Feedback, HourlyUsage, ModelPrice, RequestUsage
from apps.usage.services import feedback_set
from contract.protocol import Answer, State, Usage
from core.redis_client import get_redis, keys
from tests.browser.test_feedback import no_overflow
from tests.browser.test_tools import PASSWORD, log_in, serious_violations
from tests.conftest import BASE_DIR

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTHS = {375: 740, 1280: 800}
DAYS = 7
QWEN, LLAMA = "qwen2.5-7b-instruct", "llama-3.1-8b-instruct"
# Answers a day, per person: a heavy user, two regulars, an occasional one and a trial user
# who runs into the plan's limit.
PEOPLE = {"ada": 16, "grace": 9, "linus": 5, "margaret": 3, "ken": 7}
QUESTIONS = {
    "vacation.md": "How many vacation days can I carry over?",
    "coffee.md": "Who refills the coffee machine?",
    "deploy.md": "How do I roll back a deploy?",
    "security.html": "How often must I rotate my password?",
    "birds.txt": "Which birds nest on the roof?",
}
CHAT = ("Summarise this email thread for me.", "Rewrite this paragraph more plainly.")
COMMENTS = (
    "The rollback steps are from the old pipeline.",
    "It cited the wrong section.",
    "",
    "Made up a command that does not exist.",
)


class Week:
    """Records a week of answers and votes through the recorder and feedback_set."""

    def __init__(self) -> None:
        self.rng = random.Random(36)
        self.count = 0
        self.raw_keys: dict[int, str] = {}  # user id: the API key their scripts send
        recorder.ensure_group()

    def answer(self, user, conversation, *, kind: str, model: str, cite=None, code: str = ""):
        """Puts one answer record on the done stream, with the request fields the web would
        have attached; `record` stores the sitting's batch."""
        rng, self.count = self.rng, self.count + 1
        request_id = f"req-{self.count:04d}-{rng.getrandbits(32):08x}"
        prompt = {"chat": (300, 2400), "rag": (1500, 3600), "long": (4200, 9000)}.get(
            kind, (200, 1400)
        )
        fields = {
            "kind": kind,
            "created_ms": str(int(time.time() * 1000) - rng.randint(900, 14_000)),
        }
        text = "Here is what I found."
        if cite is not None:
            fields["citations"] = json.dumps(
                [{"number": 1, "chunk_id": cite.id, "document_id": cite.document_id}]
            )
            text = f"{cite.text[:120]} [1]"
        if kind == "api":
            fields["api_key"] = api_key_hash(self.raw_keys[user.pk])
        get_redis().hset(keys().request(request_id), mapping=fields)
        if code:  # refused by admission: nothing ran
            answer = Answer(
                id=request_id,
                user_id=str(user.pk),
                conversation_id=str(conversation.id),
                state=State.FAILED,
                error="You have reached your plan's limit; try again in a minute.",
                code=code,
                retry_after=40,
            )
        else:
            prompt_tokens = rng.randint(*prompt)
            answer = Answer(
                id=request_id,
                user_id=str(user.pk),
                conversation_id=str(conversation.id) if conversation else "",
                state=State.DONE,
                text=text,
                usage=Usage(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=rng.randint(60, 650),
                    cached_tokens=int(prompt_tokens * rng.uniform(0.2, 0.85)),
                ),
                finish_reason="stop",
                attempt=1,
                model=model,
            )
        get_redis().xadd(keys().done, answer.to_fields())
        return request_id

    def record(self, ids: list[str], *, back: timedelta) -> None:
        """Stores what is on the stream, then ages it by `back`: the recorder stamps rows with
        the current hour, and a week's chart needs a week."""
        this_hour = timezone.now().replace(minute=0, second=0, microsecond=0)
        while recorder.record_pending(consumer="shots", block_ms=10):
            pass
        if back:
            RequestUsage.objects.filter(request_id__in=ids).update(
                created=F("created") - back, hour=F("hour") - back
            )
            # Earlier sittings were aged already: the sums from this hour on are this one's.
            HourlyUsage.objects.filter(hour__gte=this_hour).update(hour=F("hour") - back)

    def vote(self, user, request_id: str, *, up: bool, back: timedelta, reasons=(), comment=""):
        feedback_set(
            user=user,
            request_id=request_id,
            vote=Feedback.UP if up else Feedback.DOWN,
            reasons=reasons,
            comment=comment,
        )
        Feedback.objects.filter(request_id=request_id).update(
            created=F("created") - back, updated=F("updated") - back
        )


def a_team_week() -> dict:
    """Plans, people, a corpus and a week of their answers and votes."""
    free, _ = Plan.objects.get_or_create(slug="free", defaults={"name": "Free"})
    plan_make_default(plan=free)
    team = Plan.objects.create(
        slug="team",
        name="Team",
        requests_per_minute=60,
        tokens_per_minute=100_000,
        burst_tokens=40_000,
        tokens_per_day=2_000_000,
        max_concurrent=4,
    )
    trial = Plan.objects.create(
        slug="trial",
        name="Trial",
        requests_per_minute=6,
        tokens_per_minute=8_000,
        burst_tokens=8_000,
        tokens_per_day=25_000,
        max_concurrent=1,
    )
    ModelPrice.objects.create(
        model=QWEN,
        prompt=Decimal("0.30"),
        cached_prompt=Decimal("0.03"),
        completion=Decimal("1.20"),
    )
    people = {name: user_create(username=name, password=PASSWORD) for name in PEOPLE}
    for name, plan in (("ada", team), ("grace", team), ("ken", trial)):
        plan_assign(user=people[name], plan=plan)
    handbook, _ = corpus_get_or_create(name="Staff handbook")
    report = corpus_ingest_paths(
        corpus=handbook, paths=[str(BASE_DIR / "tests/rag/fixtures/handbook")]
    )
    assert not report.failed, report.lines()
    chunks = list(Chunk.objects.filter(corpus=handbook).select_related("document"))
    # The deploy guide is out of date: answers citing it get voted down.
    stale = [c for c in chunks if c.document.source.endswith("deploy.md")]

    week = Week()
    _, week.raw_keys[people["ada"].pk] = api_key_create(user=people["ada"], name="nightly report")
    rng = week.rng

    def sitting(back: timedelta, answers: dict[str, int], refused=()) -> None:
        """Each person asks their questions in a conversation of their own; some vote."""
        ids, votes = [], []
        for name, n in answers.items():
            person = people[name]
            conversation = conversation_create(owner=person)
            for turn in range(n):
                chunk = rng.choice(chunks) if turn % 2 == 0 else None
                model = LLAMA if name in ("linus", "ken") or turn % 4 == 3 else QWEN
                question = QUESTIONS.get(chunk.document.source.rsplit("/", 1)[-1]) if chunk else ""
                message_create(
                    conversation=conversation, role="user", text=question or rng.choice(CHAT)
                )
                kind = "rag" if chunk else rng.choice(("chat", "chat", "long", "background"))
                request_id = week.answer(person, conversation, kind=kind, model=model, cite=chunk)
                ids.append(request_id)
                if rng.random() < 0.2:
                    votes.append((person, request_id, chunk, model))
            if name == "ken":
                for code in refused:
                    ids.append(week.answer(person, conversation, kind="chat", model="", code=code))
        week.record(ids, back=back)
        for person, request_id, chunk, model in votes:
            bad = (chunk in stale) or (model == LLAMA and rng.random() < 0.6)
            week.vote(
                person,
                request_id,
                up=not bad,
                back=back,
                reasons=(("bad_sources", "wrong") if chunk in stale else ("unhelpful",))
                if bad
                else (),
                comment=rng.choice(COMMENTS) if bad else "",
            )

    # Three sittings a day, quieter at the weekend; the trial user runs into the plan's limit
    # on some afternoons. Ada's nightly script calls the API every other day.
    for days_ago in range(DAYS - 1, -1, -1):
        quiet = 2 if days_ago in (1, 2) else 0
        for hours in (9, 5, 2):
            answers = {
                name: max(1, per_day // 3 + rng.randint(-1, 1) - quiet)
                for name, per_day in PEOPLE.items()
            }
            refused = ("rate_limited", "too_large")[: days_ago % 3] if hours == 2 else ()
            sitting(timedelta(days=days_ago, hours=hours), answers, refused)
        if days_ago % 2 == 0:
            ids = [week.answer(people["ada"], None, kind="api", model=QWEN)]
            week.record(ids, back=timedelta(days=days_ago, hours=20))
    sitting(timedelta(0), {"ken": 1})  # a question just now: the last minute's use
    admin = user_create(username="operator", password=PASSWORD)
    admin.is_staff = admin.is_superuser = True
    admin.save()
    return {"people": people, "stale": stale[0].document.title}


def photograph(page, path: Path, *, most: int = 1250) -> None:
    """The page from the top, down to `most` px: a long list of recent votes tells no more."""
    height = page.evaluate("document.documentElement.scrollHeight")
    width = page.viewport_size["width"]
    clip = {"x": 0, "y": 0, "width": width, "height": min(height, most)}
    page.screenshot(path=str(path), full_page=True, clip=clip)


def screenshot_folder() -> Path | None:
    shots = os.environ.get("SLUICE_SCREENSHOTS")
    return Path(shots) if shots else None


def test_usage_and_feedback_pages_are_axe_clean_and_fit_a_phone_and_a_desktop(
    live_web, browser_page
):
    data = a_team_week()
    page, shots = browser_page, screenshot_folder()
    page.set_default_timeout(60_000)  # other people's tests share this machine's cores
    log_in(page, live_web, "operator")
    pages = {
        "usage-admin": "/admin/ops/usage/?days=7",
        "usage-admin-user": "/admin/ops/usage/?days=7&user=ken",
        "feedback-admin": "/admin/ops/feedback/?days=7",
    }
    for width, height in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        for name, path in pages.items():
            page.goto(live_web + path)
            if name.startswith("usage-admin"):
                expect(page.locator("#chart-usage-tokens canvas").first).to_be_visible()
            assert serious_violations(page) == [], (name, width)
            no_overflow(page, width)
            if shots and width == 1280 and name in ("usage-admin", "feedback-admin"):
                photograph(page, shots / f"{name}.png")

    # What the admin tunes from is on the pages: the heaviest user first, cost where a price
    # is set, the trial user's refusals and limits, the stale guide behind the down-votes.
    page.goto(live_web + pages["usage-admin"])
    expect(page.locator("#top-title + table tbody tr").first).to_contain_text("ada")
    expect(page.locator("#model-title + table")).to_contain_text("USD")
    expect(page.locator("#refusal-title ~ table")).to_contain_text("rate_limited")
    page.goto(live_web + pages["usage-admin-user"])
    expect(page.locator(".usage-limits")).to_contain_text("ken against the Trial plan")
    page.goto(live_web + pages["feedback-admin"])
    worst = page.locator("#fb-passages ~ table tbody tr").first
    expect(worst.get_by_role("link")).to_have_text(data["stale"])
    expect(page.locator("#fb-corpus + table")).to_contain_text("Staff handbook")

    # The person's own view: the trial user, most of the day's allowance spent.
    page.context.clear_cookies()
    log_in(page, live_web, "ken")
    for width, height in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.goto(live_web + "/accounts/profile/")
        block = page.locator("#usage")
        expect(block).to_contain_text("Your plan: Trial")
        assert serious_violations(page) == [], ("profile", width)
        no_overflow(page, width)
        if shots and width == 375:
            block.screenshot(path=str(shots / "profile-usage.png"))
