"""A rolling upgrade with answers in flight: the whole stack starts on the previous release, a
steady load comes in every way (the page's websocket, the REST API with SSE, the OpenAI API),
and the workers, the standby and active dispatchers and the web processes are replaced one at a
time by this tree's code. Every accepted request ends once with its answer stored once, and no
reader sees a gap or a repeat. The order is docs/deploy.md's: migrate, workers, dispatchers
(standby first), web processes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import websockets

from contract.protocol import TERMINAL_STATES, Keys
from tests.conftest import read_sse, wait_until
from tests.faults.conftest import final_events
from tests.upgrade.conftest import query

CLIENTS_PER_WAY = 2
ANSWER_SECONDS = 6  # the longest a simulated answer takes here, waiting in line included


@dataclass
class Seen:
    """What the load's clients saw: each accepted request's events, and the longest wait
    between two events of one answer once it had begun."""

    events: dict[str, list[dict]] = field(default_factory=dict)
    way: dict[str, str] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # accepted, then cut off for good
    longest_pause: float = 0.0
    last_at: dict[str, float] = field(default_factory=dict)  # request id -> its last event
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self, request_id: str, way: str) -> list[dict]:
        with self.lock:
            self.way[request_id] = way
            return self.events.setdefault(request_id, [])

    def arrived(self, request_id: str, *, begun: bool) -> None:
        """An event of the request reached its reader (over any connection); `begun`: the
        answer was streaming, so the wait since its last event is a pause the reader saw."""
        now = time.monotonic()
        with self.lock:
            if begun and request_id in self.last_at:
                self.longest_pause = max(self.longest_pause, now - self.last_at[request_id])
            self.last_at[request_id] = now


class TimedEvents(list):
    """Where read_sse puts a reader's events: on into `events`, timing each arrival."""

    def __init__(self, request_id: str, events: list[dict], seen: Seen) -> None:
        super().__init__()
        self.request_id, self.events, self.seen = request_id, events, seen

    def append(self, event: dict) -> None:
        begun = bool(self.events) and self.events[-1]["event"] in ("start", "delta")
        self.seen.arrived(self.request_id, begun=begun)
        self.events.append(event)
        super().append(event)


class Load:
    def __init__(self, stack, seed: dict) -> None:
        self.stack = stack
        self.key = seed["key"]
        self.seed = seed
        self.seen = Seen()
        self.stopping = threading.Event()
        self.http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {self.key}"})
        self.threads: list[threading.Thread] = []

    def webs(self) -> list[str]:
        return list(self.stack.web_urls.values())

    def start(self) -> None:
        self.model = self.http.get(self.webs()[0] + "/v1/models").json()["data"][0]["id"]
        for i in range(CLIENTS_PER_WAY):
            self.threads += [
                threading.Thread(target=self._forever, args=(self.rest_sse, i)),
                threading.Thread(target=self._forever, args=(self.openai_stream, i)),
                threading.Thread(target=self._forever, args=(self.page, i)),
            ]
        for thread in self.threads:
            thread.start()

    def accepted(self) -> int:
        with self.seen.lock:
            return len(self.seen.events)

    def ways(self) -> set[str]:
        """The ways by which requests were accepted so far."""
        with self.seen.lock:
            return set(self.seen.way.values())

    def wait_for_more(self, count: int, *, what: str) -> None:
        """Until the clients have had `count` more requests accepted: the stack as it stands
        now serves them."""
        target = self.accepted() + count
        wait_until(lambda: self.accepted() >= target, timeout=60, what=what)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=90)
        self.http.close()

    def _forever(self, ask, n: int) -> None:
        turn = 0
        while not self.stopping.is_set():
            ask(n, turn)
            turn += 1

    # -- the REST API, followed over SSE and resumed on another web process when cut -----------

    def rest_sse(self, n: int, turn: int) -> None:
        request_id = None
        for base in self._rotation(turn):
            try:
                response = self.http.post(base + "/api/v1/requests", json={"text": "Rivers?"})
            except httpx.HTTPError:
                continue
            if response.status_code == 202:
                request_id = response.json()["request_id"]
                break
            assert response.status_code == 503, response.text  # restarting: ask another
        if request_id is None:
            time.sleep(0.2)
            return
        events = self.seen.accepted(request_id, "sse")
        for attempt in range(20):
            base = self._rotation(turn + attempt)[0]
            after = events[-1]["id"] if events else "0"
            headers = {"Authorization": f"Bearer {self.key}", "Last-Event-ID": after}
            url = f"{base}/api/v1/requests/{request_id}/events"
            try:
                with httpx.stream("GET", url, headers=headers, timeout=30) as response:
                    if response.status_code == 200:
                        read_sse(response, into=TimedEvents(request_id, events, self.seen))
            except httpx.HTTPError:
                pass
            if events and events[-1]["event"] == "final":
                return
            time.sleep(0.2)
        self.seen.broken.append(request_id)

    # -- the OpenAI API: a stream cannot be resumed, so it must never be cut ---------------------

    def openai_stream(self, n: int, turn: int) -> None:
        body = {
            "model": self.model,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        }
        for base in self._rotation(turn):
            chunks: list[str] = []
            try:
                with self.http.stream("POST", base + "/v1/chat/completions", json=body) as response:
                    if response.status_code == 503:
                        continue  # restarting: ask another
                    assert response.status_code == 200, response.read()
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            self.seen.arrived(f"{n}/{turn}", begun=bool(chunks))
                            chunks.append(line[6:])
            except httpx.ConnectError:
                continue
            except httpx.HTTPError:
                pass  # cut mid-stream: recorded below
            request_id = json.loads(chunks[0])["id"].removeprefix("chatcmpl-") if chunks else None
            if request_id is None:
                continue
            self.seen.accepted(request_id, "openai").extend(
                {"event": "chunk", "data": c} for c in chunks
            )
            if chunks[-1] != "[DONE]":
                self.seen.broken.append(request_id)
            return
        time.sleep(0.2)

    # -- the page's websocket: reconnects to another web process and resumes ---------------------

    def page(self, n: int, turn: int) -> None:
        asyncio.run(self._page(self.seed["conversations"][n], turn))

    async def _page(self, conversation: int, turn: int) -> None:
        request_id, events = None, []
        for attempt in range(20):
            base = self._rotation(turn + attempt)[0].replace("http://", "ws://")
            query_string = f"?resume={request_id}&after={events[-1]['event_id']}" if events else ""
            url = f"{base}/ws/chat/{conversation}/{query_string}"
            headers = {
                "Origin": base.replace("ws://", "http://"),
                "Cookie": f"sessionid={self.seed['session']}",
            }
            try:
                async with websockets.connect(url, additional_headers=headers) as ws:
                    if request_id is None:
                        await ws.send(json.dumps({"type": "send", "text": "Tell me of rivers."}))
                    async for raw in ws:
                        frame = json.loads(raw)
                        if frame["type"] == "request" and request_id is None:
                            request_id = frame["request_id"]
                            events = self.seen.accepted(request_id, "page")
                        elif frame.get("request_id") == request_id and "event_id" in frame:
                            begun = bool(events) and events[-1]["type"] in ("start", "delta")
                            self.seen.arrived(request_id, begun=begun)
                            events.append(frame)
                            if frame["type"] == "final":
                                return
                        elif frame["type"] == "error" and request_id is None:
                            await asyncio.sleep(0.3)  # e.g. the last answer still ends: ask again
                            await ws.send(json.dumps({"type": "send", "text": "Rivers again?"}))
            except (OSError, websockets.WebSocketException):
                pass
            if self.stopping.is_set() and request_id is None:
                return
            await asyncio.sleep(0.3)
        if request_id:
            self.seen.broken.append(request_id)

    def _rotation(self, turn: int) -> list[str]:
        webs = self.webs()
        return webs[turn % len(webs) :] + webs[: turn % len(webs)]


def test_a_rolling_upgrade_with_answers_in_flight_loses_nothing(upgrade_stack):
    stack = upgrade_stack
    stack.manage("old", "migrate", "--no-input")
    seed = stack.seed()
    stack.web("web-a", "old")
    stack.web("web-b", "old")
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()

    def holds_the_lease(*names: str):
        """Whether one of these dispatchers holds the lease (it holds it under its host and
        process id, apps/ops/management/commands/run_dispatcher.py)."""
        holders = {f"{socket.gethostname()}-{stack.processes[n].pid}" for n in names}
        return lambda: client.get(keys.lease) in holders

    stack.dispatcher("dispatcher-1", "old")
    # The first dispatcher takes the lease; the second stands by.
    wait_until(holds_the_lease("dispatcher-1"), timeout=60, what="dispatcher-1 to take the lease")
    stack.dispatcher("dispatcher-2", "old")
    for name in ("w1", "w2"):
        stack.worker(name, "old")

    def beating(name: str):
        return lambda: client.exists(keys.heartbeat(name))

    def serving(name: str):
        """The worker runs answers, or has run some (its heartbeat says so)."""

        def check() -> bool:
            raw = client.get(keys.heartbeat(name))
            beat = json.loads(raw) if raw else {}
            return bool(beat.get("busy") or beat.get("completed"))

        return check

    for name in ("w1", "w2"):
        wait_until(beating(name), timeout=60, what=f"{name} to beat")

    load = Load(stack, seed)
    load.start()
    wait_until(
        lambda: load.ways() == {"sse", "openai", "page"},
        timeout=60,
        what="answers in flight every way",
    )
    stack.manage("new", "migrate", "--no-input")  # while the old release serves
    for name in ("w1", "w2"):
        assert stack.stop(name) == 0, name
        stack.worker(name, "new")
        wait_until(beating(name), timeout=60, what=f"the new {name} to beat")
        wait_until(serving(name), timeout=60, what=f"the new {name} to take work")
    for name in ("dispatcher-2", "dispatcher-1"):  # the standby first, then the active one
        assert stack.stop(name) == 0, name
        stack.dispatcher(name, "new")
        wait_until(
            lambda name=name: "dispatcher running" in stack.log(name, "new"),
            timeout=60,
            what=f"the new {name} to run",
        )
    # The new standby took over from the active one as it stopped (or the new one took it).
    wait_until(
        holds_the_lease("dispatcher-2", "dispatcher-1"),
        timeout=60,
        what="a new dispatcher to hold the lease",
    )
    for name in ("web-a", "web-b"):
        # Out of the rotation first, as a load balancer takes it out, and its streams let end
        # before it is stopped (docs/deploy.md): a load balancer's drain time, the longest an
        # answer takes, let pass. (Needed for a release before core/draining.py, which could
        # not drain on SIGTERM by itself; harmless for one that can.)
        stack.web_urls.pop(name)
        time.sleep(ANSWER_SECONDS)
        assert stack.stop(name) == 0, name
        stack.web(name, "new")
        load.wait_for_more(CLIENTS_PER_WAY * 3, what=f"the load to carry on with the new {name}")
    load.wait_for_more(CLIENTS_PER_WAY * 3, what="the load to carry on on the new release")
    load.stop()

    seen = load.seen
    ids = list(seen.events)
    ways = {way: sum(1 for w in seen.way.values() if w == way) for way in ("sse", "openai", "page")}
    print(
        f"\nupgrade: {len(ids)} answers in flight through it {ways}; "
        f"longest pause a reader saw {seen.longest_pause:.2f} s"
    )
    assert all(ways.values()), ways
    assert not seen.broken, f"readers cut off for good: {seen.broken}"

    def all_ended():
        pipe = client.pipeline(transaction=False)
        for request_id in ids:
            pipe.hget(keys.request(request_id), "state")
        found = dict(zip(ids, pipe.execute(), strict=True))
        return found if all(s in TERMINAL_STATES for s in found.values()) else None

    ended = wait_until(all_ended, timeout=60, what="every accepted request to end")
    assert set(ended.values()) == {"done"}, ended
    for request_id in ids:
        assert len(final_events(client, keys, request_id)) == 1, request_id

    # Answers in conversations are stored (the OpenAI API's are settled, not stored).
    in_conversations = [i for i in ids if seen.way[i] != "openai"]

    def all_stored():
        rows = query(
            stack.dbname,
            "SELECT request_id, count(*) FROM chat_message WHERE request_id = ANY(%s) "
            "GROUP BY request_id",
            (in_conversations,),
        )
        return rows if len(rows) == len(in_conversations) else None

    stored = wait_until(all_stored, timeout=30, what="every answer to be stored")
    assert all(count == 1 for _, count in stored)
    for request_id, events in seen.events.items():
        _read_once(seen.way[request_id], events)
    for name, process in stack.processes.items():
        assert process.poll() is None, f"{name} ({stack.trees[name]}) exited"
        assert stack.trees[name] == "new"


def _read_once(way: str, events: list[dict]) -> None:
    """No gap and no repeat: each event once, the text streamed since the last start equal to
    the final text (SSE), a finished OpenAI stream."""
    if way == "openai":
        assert events[-1]["data"] == "[DONE]"
        reasons = [
            json.loads(e["data"])["choices"][0]["finish_reason"]
            for e in events[:-1]
            if json.loads(e["data"]).get("choices")
        ]
        assert reasons[-1] == "stop", reasons
        return
    ids = [e["id"] if way == "sse" else e["event_id"] for e in events]
    assert len(ids) == len(set(ids)), "an event was shown twice"
    if way == "sse":
        assert events[-1]["event"] == "final"
        starts = [i for i, e in enumerate(events) if e["event"] == "start"]
        since = events[starts[-1] :] if starts else events
        streamed = "".join(e["data"]["text"] for e in since if e["event"] == "delta")
        assert streamed == events[-1]["data"]["text"], "text was lost or repeated"
    else:
        assert events[-1]["type"] == "final"
