"""The people bench/load.py sends: browser users (the chat page's form, page and websockets) and
API users (POST, then the Server-Sent Events stream), each asking one question at a time, and
what each question met.

A browser user starts a chat as the page does: the new-chat form is posted, the redirect loads
the conversation's page, and chat.js opens the chat socket (which follows the answer in
progress from its first event) and the inbox socket (follow-up suggestions, titles). Later
questions in that chat go over the open chat socket. An API user posts to /api/v1/requests,
with its last conversation or none, and reads the events URL it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from dataclasses import dataclass

from harness import origin_of

from devstack.stack import say

LIMIT = 60.0  # seconds: a question not answered by then is an error
READING = 5.0  # seconds a person reads an answer before they can ask again
PENDING = re.compile(r'class="message assistant pending" data-request-id="([^"]+)"')
COMPOSER_ERROR = re.compile(r'id="composer-error"[^>]*>([^<]+)<')
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class Asked:
    """One question: when it was sent, when its first text and its end arrived (perf_counter
    seconds), and how it ended. `step`: the arrival step it belongs to."""

    step: int
    path: str  # "page" (browser) or "api"
    new: bool  # the first question of a new conversation
    topic: bool  # about Sluice's docs: the relevance gate lets passages through
    sent: float
    first: float | None = None
    end: float | None = None
    ok: bool = False
    reason: str = ""

    def waited(self, now: float) -> float:
        """Seconds to the first text; for a question with none yet, the time it has waited
        (until it ended, or until `now` while it is still open)."""
        return (self.first or self.end or now) - self.sent

    def failed(self, now: float) -> bool:
        """An error: ended without an answer, or open past the limit."""
        if self.end is None:
            return now - self.sent > LIMIT
        return not self.ok


class Mix:
    """What people ask: a new chat's first question is about Sluice (`topic` share) or general;
    a later one is a follow-up phrase half the time, else a new question."""

    def __init__(self, rng: random.Random, topic: float) -> None:
        from demo_ttft import FIRST, FOLLOW_UP, on_topic_questions

        self.rng, self.topic_share = rng, topic
        self.general, self.follow_up = FIRST, FOLLOW_UP
        self.on_topic = on_topic_questions(100)

    def question(self, *, new: bool) -> tuple[str, bool]:
        if not new and self.rng.random() < 0.5:
            return self.rng.choice(self.follow_up), False
        if self.rng.random() < self.topic_share:
            return self.rng.choice(self.on_topic), True
        return self.rng.choice(self.general), False


class Person:
    """One user: asks one question at a time, reads the answer, then may ask again."""

    free_at = 0.0  # perf_counter time from which this person can be picked again
    busy = False

    def idle(self, now: float) -> bool:
        return not self.busy and now >= self.free_at

    async def ask(self, asked: Asked, text: str) -> None:
        self.busy = True
        try:
            async with asyncio.timeout(LIMIT):
                await self._ask(asked, text)
        except TimeoutError:
            asked.reason = f"no answer in {LIMIT:.0f} s"
            await self.reset()  # a person gives up on the page
        except Exception as exc:  # what the person sees: the question failed
            asked.reason = asked.reason or f"{type(exc).__name__}: {exc}"[:120]
            await self.reset()
        finally:
            asked.end = time.perf_counter()
            self.busy, self.free_at = False, asked.end + READING

    async def _ask(self, asked: Asked, text: str) -> None:
        raise NotImplementedError

    async def reset(self) -> None:
        """Forgets the open conversation (the next question starts a new one)."""

    async def close(self) -> None:
        await self.reset()


class Browser(Person):
    def __init__(self, base_url: str, cookie: str) -> None:
        import httpx

        self.base_url, self.cookie = base_url, cookie
        self.http = httpx.AsyncClient(
            base_url=base_url, cookies={"sessionid": cookie}, timeout=LIMIT, follow_redirects=True
        )
        self.csrf = ""
        self.chat = self.inbox = self.inbox_reader = None

    @property
    def has_chat(self) -> bool:
        return self.chat is not None

    async def open_form(self) -> None:
        """The new-chat page, as the browser loaded it before (its form's CSRF token)."""
        page = await self.http.get("/c/new/")
        found = CSRF.search(page.text)
        if page.status_code != 200 or not found:
            raise RuntimeError(f"new-chat page: HTTP {page.status_code}")
        self.csrf = found.group(1)

    async def _socket(self, path: str):
        import websockets

        url = self.base_url.replace("http://", "ws://") + path
        headers = {"Origin": origin_of(url), "Cookie": f"sessionid={self.cookie}"}
        return await websockets.connect(url, additional_headers=headers, max_size=None)

    async def _ask(self, asked: Asked, text: str) -> None:
        if asked.new or self.chat is None:
            await self.reset()
            page = await self.http.post(
                "/c/new/", data={"csrfmiddlewaretoken": self.csrf, "text": text}
            )
            found = re.fullmatch(r"/c/(\d+)/", page.url.path)
            if page.status_code != 200 or not found:
                refused = COMPOSER_ERROR.search(page.text)
                why = refused.group(1).strip() if refused else f"at {page.url.path}"
                asked.reason = f"new chat: HTTP {page.status_code} {why}"[:120]
                raise RuntimeError(asked.reason)
            self.chat = await self._socket(f"/ws/chat/{found.group(1)}/")
            self.inbox = await self._socket("/ws/inbox/")
            self.inbox_reader = asyncio.ensure_future(_drain(self.inbox))
            pending = PENDING.search(page.text)
            if pending is None:  # answered before the page was served: it is on the page
                asked.first, asked.ok = time.perf_counter(), True
                return
            # The socket replays the answer in progress from its start; one that ended between
            # the page and the socket is on the next page load: ask for its state instead.
            await self._follow(asked, request_id=pending.group(1), quiet=3.0)
        else:
            await self.chat.send(json.dumps({"type": "send", "text": text}))
            await self._follow(asked, request_id=None, quiet=None)

    async def _follow(self, asked: Asked, *, request_id: str | None, quiet: float | None):
        while True:
            try:
                async with asyncio.timeout(quiet):
                    frame = json.loads(await self.chat.recv())
            except TimeoutError:
                state = (await self.http.get(f"/api/v1/requests/{request_id}")).json()
                if state.get("state") in ("done", "failed", "cancelled"):
                    asked.first = asked.first or time.perf_counter()
                    asked.ok = state["state"] == "done"
                    asked.reason = "" if asked.ok else f"answer {state['state']}"
                    return
                quiet = None  # still on its way: the socket will carry it
                continue
            kind = frame.get("type")
            if kind == "delta" and asked.first is None:
                asked.first = time.perf_counter()
            elif kind == "final":
                asked.ok = frame.get("state") == "done"
                asked.reason = "" if asked.ok else str(frame.get("error") or frame.get("state"))
                return
            elif kind == "error":
                asked.reason = str(frame.get("message") or "error frame")[:120]
                return

    async def reset(self) -> None:
        for socket in (self.chat, self.inbox):
            if socket is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(socket.close(), 2)
        if self.inbox_reader is not None:
            self.inbox_reader.cancel()
        self.chat = self.inbox = self.inbox_reader = None

    async def close(self) -> None:
        await self.reset()
        await self.http.aclose()


async def _drain(socket) -> None:
    """Reads the inbox socket as the page does (follow-up suggestions, titles), and drops it."""
    with contextlib.suppress(Exception):
        async for _ in socket:
            pass


class ApiUser(Person):
    def __init__(self, http, base_url: str, key: str) -> None:
        self.http, self.base_url = http, base_url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.conversation: int | None = None

    @property
    def has_chat(self) -> bool:
        return self.conversation is not None

    async def _ask(self, asked: Asked, text: str) -> None:
        body: dict = {"text": text}
        if not asked.new and self.conversation is not None:
            body["conversation"] = self.conversation
        created = await self.http.post(
            f"{self.base_url}/api/v1/requests", json=body, headers=self.headers
        )
        if created.status_code != 202:
            asked.reason = f"HTTP {created.status_code}: {created.text[:80]}"
            return
        self.conversation = created.json()["conversation"]
        url = self.base_url + created.json()["events_url"]
        async with self.http.stream("GET", url, headers=self.headers) as events:
            kind = ""
            async for line in events.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                    if kind == "delta" and asked.first is None:
                        asked.first = time.perf_counter()
                elif line.startswith("data: ") and kind in ("final", "error"):
                    data = json.loads(line[6:])
                    asked.ok = kind == "final" and data.get("state") == "done"
                    if not asked.ok:
                        asked.reason = str(data.get("error") or data.get("state") or kind)
                    return
        asked.reason = "the event stream ended without a final event"

    async def reset(self) -> None:
        self.conversation = None


def create_people(count: int, api_count: int, run: str) -> tuple[list[str], list[str]]:
    """`count` signed-in browser users (session cookies) and `api_count` API users (keys), on
    the default plan, half of them with one of the demo's profile tags."""
    from django.contrib.auth.hashers import make_password
    from django.test import Client

    from apps.accounts.models import Profile, Tag, User
    from apps.accounts.services import api_key_create

    hashed = make_password("load-password-1")  # hashed once: hashing is slow on purpose
    tags = list(Tag.objects.all())
    cookies, keys = [], []
    for n in range(count + api_count):
        user = User.objects.create(username=f"load{run}-{n}", password=hashed)
        profile = Profile.objects.create(user=user, display_name=user.username)
        if tags and n % 2:
            profile.tags.add(tags[n % len(tags)])
        if n < count:
            client = Client()
            client.force_login(user)
            cookies.append(client.cookies["sessionid"].value)
        else:
            keys.append(api_key_create(user=user, name="load")[1])
    return cookies, keys


async def warm_up(browser: Person, api_user: Person) -> None:
    """Untimed: the worker loads its model, the web its embedding model; then the follow-ups
    and titles they asked for are served before the first step."""
    for _ in range(60):
        asked = Asked(-1, "page", True, True, time.perf_counter())
        await browser.ask(asked, "How does Sluice stream tokens to the browser?")
        if asked.ok:
            break
        say(f"warm-up: {asked.reason or 'no answer'}; retrying")
        await asyncio.sleep(2)
    await api_user.ask(Asked(-1, "api", True, False, time.perf_counter()), "Why is the sky blue?")
    await asyncio.sleep(8)
