"""The dispatcher's Prometheus metrics, served on its own port (`DISPATCHER_METRICS_PORT`).

Decisions are this process's counts as it wrote them (apps/admission/metrics.py `TOTALS`), so a
standby shows zeros and the lease holder what it decided since it started; answers it settled
feed the wait, latency and estimate histograms; the line's depth and the requests running are
read from the dispatcher's memory when Prometheus scrapes.
"""

from __future__ import annotations

import logging

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from apps.admission import metrics
from apps.admission.dispatcher import Dispatcher
from apps.admission.timeseries import AnswerFigures

log = logging.getLogger("sluice.dispatcher")

SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class Figures:
    """One dispatcher's metrics, in a registry of their own."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        r.register(DecisionCollector())
        Gauge(
            "sluice_dispatcher_active", "1 while this dispatcher holds the lease.", registry=r
        ).set_function(lambda: float(dispatcher.active))
        Gauge(
            "sluice_dispatcher_queue_depth", "Requests waiting in line.", registry=r
        ).set_function(lambda: float(len(dispatcher.line)))
        Gauge(
            "sluice_dispatcher_running", "Requests on workers, not yet settled.", registry=r
        ).set_function(lambda: float(len(dispatcher.running)))
        Gauge(
            "sluice_dispatcher_degradation_level",
            "Degradation level this dispatcher set.",
            registry=r,
        ).set_function(lambda: float(dispatcher.degradation.level))
        self.answers = Counter(
            "sluice_dispatcher_answers_settled",
            "Answers settled, by end state and whether a worker ran them.",
            ["state", "ran"],
            registry=r,
        )
        self.wait = Histogram(
            "sluice_dispatcher_queue_wait_seconds",
            "From submission to dispatch to a worker.",
            buckets=SECONDS,
            registry=r,
        )
        self.ttft = Histogram(
            "sluice_dispatcher_ttft_seconds",
            "Time to first token as users see it: wait in line + the engine's.",
            buckets=SECONDS,
            registry=r,
        )
        self.e2e = Histogram(
            "sluice_dispatcher_end_to_end_seconds",
            "From submission to the answer being settled.",
            buckets=SECONDS,
            registry=r,
        )
        self.estimate = Histogram(
            "sluice_dispatcher_prompt_estimate_ratio",
            "Real prompt tokens over the web's estimate (1: exact; the estimator's error).",
            buckets=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0),
            registry=r,
        )
        dispatcher.samples.hooks.append(self.observe)

    def observe(self, record: AnswerFigures) -> None:
        self.answers.labels(str(record.answer.state), "yes" if record.ran else "no").inc()
        for histogram, value in (
            (self.wait, record.wait_ms),
            (self.ttft, record.ttft_ms),
            (self.e2e, record.e2e_ms),
        ):
            if value is not None:
                histogram.observe(value / 1000)
        if record.prompt_estimate_ratio is not None:
            self.estimate.observe(record.prompt_estimate_ratio)


class RouteCollector(Collector):
    """Where this dispatcher routed requests (routing.py's counts)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.counts = dispatcher.fleet.router.counts

    def collect(self):
        routed = CounterMetricFamily(
            "sluice_dispatcher_routed",
            "Requests routed: affinity (the conversation's worker), "
            "prefix (a worker holding its system prompt), shared, pushed (push policies), "
            "fallbacks (a cached worker was too busy: shared).",
            labels=["route"],
        )
        for route, n in vars(self.counts).items():
            routed.add_metric([route], n)
        yield routed


class DecisionCollector(Collector):
    """Admission decisions this process wrote, by outcome and reason, and tokens per plan."""

    def collect(self):
        totals = dict(metrics.TOTALS)
        decisions = CounterMetricFamily(
            "sluice_dispatcher_decisions",
            "Admission decisions, by outcome and reason.",
            labels=["outcome", "reason"],
        )
        for status in metrics.STATUSES:
            reasons = metrics.REASONS.get(status, ())
            counted = 0
            for reason in reasons:
                n = totals.get(f"requests:{status}:{reason}", 0)
                counted += n
                decisions.add_metric([status, reason], n)
            rest = totals.get(f"requests:{status}", 0) - counted
            if rest or not reasons:
                decisions.add_metric([status, ""], max(0, rest))
        yield decisions
        tokens = CounterMetricFamily(
            "sluice_dispatcher_plan_tokens", "Real tokens settled, per plan.", labels=["plan"]
        )
        for name, n in sorted(totals.items()):
            if name.startswith("tokens:"):
                tokens.add_metric([name[7:]], n)
        yield tokens


def serve(dispatcher: Dispatcher, port: int, *, addr: str = "0.0.0.0") -> Figures:
    figures = Figures(dispatcher)
    start_http_server(port, addr=addr, registry=figures.registry)
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return figures
