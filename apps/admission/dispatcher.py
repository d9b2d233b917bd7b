"""The dispatcher: admission decisions, the fair line, release to workers, positions.

Only the holder of a lease in Redis acts (lease.py); a standby takes over when the holder stops
renewing it. Redis holds the truth: the line (the `queue` hash) and the requests running (the
`running` hash) are written in the same MULTI as each step that changes them; the mirrors in
memory are rebuilt from Redis on takeover and after any Redis error. One module per phase:

    intake     new admission entries decided; requests held by their plan's rate retried
    sweep      stops and queue-wait deadlines of waiting requests
    release    waiting requests handed to workers as they free slots (fleet view, routing)
    reconcile  answers settle their charges and running counts; lost requests are ended
    positions  "#n in line (about t s)" pushed to waiting requests
    degradation  the level of load shedding, published for the web

A pass costs about the same with 50 or 50,000 requests waiting (see watch.py, positions.py).
The answer recorder (apps/chat) is not called from here: the process that runs the loop
(apps/ops' run_dispatcher) passes it in as `recorder_pass`, and it calls `settle`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from apps.admission.buckets import BucketStore
from apps.admission.degradation import (
    Degradation,
    ProcessCpu,
    degradation_publish,
    pressure_measure,
)
from apps.admission.estimates import Estimator
from apps.admission.fairqueue import PEOPLE
from apps.admission.intake import Intake
from apps.admission.kinds import is_background
from apps.admission.lease import Lease
from apps.admission.line import Line
from apps.admission.plans import PlanBook
from apps.admission.positions import Positions
from apps.admission.reconcile import Reconcile
from apps.admission.release import FleetView, Release
from apps.admission.running import Running
from apps.admission.servicetimes import ServiceTimes
from apps.admission.sweep import Sweep
from apps.admission.timeseries import Samples
from apps.admission.unserved import fail_unreadable
from contract import protocol, transitions
from contract.protocol import Answer, Keys

log = logging.getLogger("sluice.dispatcher")


@dataclass
class Options:
    lease_ms: int = 5000
    batch: int = 500  # admission entries read (and decided in one script call) at once
    prefetch: int = 0  # work entries allowed beyond the free slots (0: strictly as slots free)
    quantum: int = 256  # DRR tokens per turn per unit of plan weight
    block_ms: int = 50  # how long an idle loop waits for new admissions
    position_interval: float = 1.0
    position_pushes: int = 1000  # position events per pass (the head's changes come first)
    # Share of the dispatcher's time that recomputing the whole line's order may take: with a
    # long queue, positions beyond the head are refreshed less often than every interval.
    position_share: float = 0.05
    sweep_interval: float = 1.0  # cancel flags and queue-wait deadlines
    cancel_checks: int = 5000  # cancel flags read per sweep, beyond the stops noted in a set
    degradation_interval: float = 2.0
    fleet_interval: float = 0.5  # heartbeats reread at most this often (workers beat every 2 s)
    reconcile_interval: float = 5.0  # lost requests looked for
    # The recorder runs at least this often, even in passes that saw no answer record and
    # admitted new requests (see `step`).
    record_interval: float = 0.05
    lost_grace: float = 15.0  # seconds after dispatch before a request is checked at all


class Dispatcher:
    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        options: Options | None = None,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
        bucket_clock: Callable[[], int] | None = None,
        recorder_pass: Callable[[Dispatcher], int] | None = None,
    ) -> None:
        o = self.options = options or Options()
        self.client, self.keys, self.clock = client, keys, clock
        self.bucket_clock = bucket_clock  # None: the bucket script reads Redis TIME
        self.recorder_pass = recorder_pass
        self.lease = Lease(
            client, keys.lease, holder=holder or uuid.uuid4().hex, lease_ms=o.lease_ms
        )
        self.plans = PlanBook()
        self.buckets = BucketStore(client)
        self.line = Line(keys, quantum=o.quantum)
        self.running = Running(keys)
        self.fleet = FleetView(client, keys, interval=o.fleet_interval)
        self.degradation = Degradation()
        self.cpu = ProcessCpu()  # this process's own share, one of degradation's signals
        shared = dict(client=client, keys=keys, now_ms=self.now_ms)
        self.samples = Samples(client, keys, now_ms=self.now_ms)  # the ops page's figures
        # Learned from the answers, kept in Redis for the next lease holder (see load).
        self.estimator = Estimator(keys)
        self.service = ServiceTimes(keys)
        self.intake = Intake(
            **shared,
            plans=self.plans,
            buckets=self.buckets,
            line=self.line,
            bucket_now=self.bucket_now,
            batch=o.batch,
            estimator=self.estimator,
        )
        self.sweep = Sweep(**shared, line=self.line, cancel_checks=o.cancel_checks)
        self.release = Release(
            **shared,
            line=self.line,
            running=self.running,
            plans=self.plans,
            fleet=self.fleet,
            prefetch=o.prefetch,
        )
        self.reconcile = Reconcile(
            **shared,
            plans=self.plans,
            buckets=self.buckets,
            running=self.running,
            fleet=self.fleet,
            bucket_now=self.bucket_now,
            grace_ms=int(o.lost_grace * 1000),
            samples=self.samples,
            estimator=self.estimator,
            service=self.service,
        )
        self.positions = Positions(
            **shared,
            line=self.line,
            fleet=self.fleet,
            pushes=o.position_pushes,
            share=o.position_share,
            service=self.service,
            plans=self.plans,
            running=self.running,
        )
        self.active = self.loaded = False
        self.loads = 0  # how many times the mirrors were rebuilt from Redis
        self._due: dict[str, float] = {}

    def step(self) -> int:
        """One pass; returns how many admission entries it decided. Raises Redis errors (the
        caller waits and retries; the mirrors are rebuilt from Redis afterwards)."""
        o = self.options
        try:
            if not self._hold_lease():
                return 0
            if not self.loaded:
                self.load()
            self.plans.refresh()
            # With requests waiting, wake often to notice freed slots; idle, wait for arrivals.
            block_ms = min(20, o.block_ms) if len(self.line) else o.block_ms
            entries = self.intake.read(block_ms=block_ms)
            # The new requests' MULTI is the release's too: a request that arrives to a free
            # slot leaves for a worker one round trip sooner. Written first, on its own, when
            # the held requests' retry or the sweep (which write the line too) comes between.
            pipe = self.client.pipeline(transaction=True)
            # The fleet is read in the bucket script's round trip, for the release below.
            self.fleet.drop_read()
            decided = self.intake.decide(
                entries, level=self.degradation, pipe=pipe, alongside=self.release.read_ahead
            )
            sweep = self._every("sweep", o.sweep_interval)
            if decided and (sweep or self.intake.held_due()):
                self.intake.written(pipe.execute())
            self.intake.retry_held()
            if sweep:
                self.sweep.run()
            # Background work waits while the service degrades: people first, always.
            self.release.run(pipe, background=self.degradation.level == 0)
            answers_seen = self.intake.answers_seen_ack(pipe)  # last: replies are read by index
            if len(pipe):
                self.intake.written(pipe.execute())
            # After the release: a request just admitted goes out before this pass stores the
            # answers that finished meanwhile (the next pass sees the slots they freed). A pass
            # that saw answer records stores them (a question sent right after its answer
            # waits for that), and so does every pass while a request waits for the slots that
            # the answers' settling frees; at least every `record_interval` in any case (the
            # backlog after a load).
            if self.recorder_pass and (
                not decided
                or len(self.line)
                or answers_seen
                or self._every("record", o.record_interval)
            ):
                self.recorder_pass(self)
            if self._every("reconcile", o.reconcile_interval):
                self.reconcile.find_lost()
            self.reconcile.save_learning()
            if self._every("positions", o.position_interval):
                self.positions.tell()
            if self._every("degradation", o.degradation_interval):
                self.publish_degradation()
            self.samples.tick(
                line=self.line,
                fleet_view=self.fleet,
                running=len(self.running),
                degradation=self.degradation,
                holder=self.lease.holder,
            )
            return decided
        except redis.RedisError:
            self.loaded = False
            raise

    def settle(self, answers: list[Answer]) -> None:
        """The recorder's callback: each answer record it read settles its request."""
        self.reconcile.settle(answers)

    def load(self) -> None:
        """Rebuilds the mirrors from Redis: what a new lease holder starts from."""
        pipe = self.client.pipeline(transaction=False)
        transitions.ensure_groups(
            pipe,
            [
                (self.keys.admit, protocol.DISPATCHER_GROUP),
                (self.keys.done, protocol.RECORDER_GROUP),
                (self.keys.done, protocol.DISPATCHER_GROUP),  # a wake-up only: Intake.read
            ],
        )
        transitions.check_groups(pipe.execute(raise_on_error=False))
        unreadable = self.line.load(self.client)
        self.running.load(self.client)
        self.estimator.load(self.client)
        self.service.load(self.client)
        self.samples.users.load()
        self.intake.reset()
        fail_unreadable(self.client, self.keys, unreadable)
        self.loaded = True
        self.loads += 1
        log.info(
            "queue loaded from Redis: %d waiting, %d running", len(self.line), len(self.running)
        )

    def publish_degradation(self) -> Degradation:
        fleet = self.fleet.fleet
        now = self.now_ms()
        pressure = pressure_measure(
            self.client,
            self.keys,
            backlog=self.line.fair.waiting(PEOPLE),
            wait_s=max(self.release.take_longest_wait_ms(), self._head_wait_ms(now)) / 1000,
            own_cpu=self.cpu.share(),
            heartbeats=fleet.heartbeats,
            now_ms=now,
        )
        self.degradation = degradation_publish(
            self.client,
            self.keys,
            settings=self.plans.degradation,
            pressure=pressure,
            workers=len(fleet.workers),
            slots=fleet.slots,
            running=len(self.running),
            service_s=self.service.overall(),
        )
        return self.degradation

    def _head_wait_ms(self, now: int) -> int:
        """How long the person's request first in line has waited (0: none waits)."""
        head = self.line.head(1)
        request = self.line.requests.get(head[0]) if head else None
        if request is None or not request.charged or is_background(request.kind):
            return 0
        return max(0, now - request.submitted_ms)

    def release_lease(self) -> None:
        """On a clean stop: the standby need not wait for the lease to expire, and finds
        everything this holder learned."""
        if self.active:
            with contextlib.suppress(redis.RedisError):
                self.reconcile.save_learning(force=True)
        self.lease.give_up()
        self.active = False

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def bucket_now(self) -> int | None:
        return self.bucket_clock() if self.bucket_clock else None

    def _hold_lease(self) -> bool:
        held = self.lease.hold()
        if held != self.active:  # taken or lost: the mirrors are someone else's work
            self.active, self.loaded = held, False
        return held

    def _every(self, name: str, interval: float) -> bool:
        now = time.monotonic()
        if now >= self._due.get(name, 0):
            self._due[name] = now + interval
            return True
        return False
