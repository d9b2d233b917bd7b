"""`/metrics` of a web process, in the Prometheus format, for staff sessions or `Authorization:
Bearer $METRICS_TOKEN`.

Two parts: this process's own figures (HTTP requests, the answer streams it relays, the usual
process figures), and the admission figures the dispatcher keeps in Redis (decisions by
outcome and reason, the queue, the degradation level, the fleet's gauges), which any web
replica can serve. Scrape each web process directly (not through the load balancer) for the
former; the latter are the same from each.
"""

from __future__ import annotations

import hmac

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from apps.admission.degradation import Degradation
from apps.admission.metrics import LATENCY_BUCKETS_MS, REASONS, STATUSES
from apps.admission.selectors import estimate_figures
from apps.rag import fleet as rag_fleet
from core.redis_client import get_redis, keys

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
HTTP_REQUESTS = Counter(
    "sluice_web_http_requests",
    "HTTP requests this web process answered.",
    ["method", "status"],
    registry=REGISTRY,
)
HTTP_SECONDS = Histogram(
    "sluice_web_http_request_seconds",
    "Time to the response's start, per HTTP request.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
# Retrieval models on the fleet: requests by outcome, their time, questions left without.
for _collector in rag_fleet.COLLECTORS:
    REGISTRY.register(_collector)
STREAMS_OPEN = Gauge(
    "sluice_web_streams_open",
    "Answer streams this process relays now (websockets and SSE).",
    registry=REGISTRY,
)


def _streams_open() -> float:
    from apps.streams import hub

    # The output hubs' watched streams (one hub per event loop): every relayed answer, on a
    # websocket or over SSE, reads through one.
    hubs = list(getattr(hub, "_hubs", {}).values())
    return float(sum(len(getattr(h, "_subs", {})) for h in hubs))


STREAMS_OPEN.set_function(_streams_open)


def allowed(request: HttpRequest) -> bool:
    if request.user.is_authenticated and request.user.is_staff:
        return True
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(header.encode(), f"Bearer {token}".encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponse(
            "Staff or a metrics token only.\n", status=403, content_type=CONTENT_TYPE
        )
    own = generate_latest(REGISTRY)
    try:
        shared = CollectorRegistry()
        shared.register(AdmissionCollector(admission_snapshot()))
        return HttpResponse(own + generate_latest(shared), content_type=CONTENT_TYPE)
    except redis.RedisError:
        body = own + b"# Redis unreachable\nsluice_redis_up 0\n"
        return HttpResponse(body, status=503, content_type=CONTENT_TYPE)


def admission_snapshot() -> tuple[dict[str, str], int, Degradation]:
    """The dispatcher's counters, the queue's depth and the level in force: one round trip."""
    k = keys()
    pipe = get_redis().pipeline(transaction=False)
    pipe.hgetall(k.metrics)
    pipe.hlen(k.queue)
    pipe.get(k.degradation)
    counters, depth, level = pipe.execute()
    return counters, int(depth), Degradation.from_json(level)


class AdmissionCollector(Collector):
    """The admission figures, as the dispatcher keeps them in Redis."""

    def __init__(self, snapshot: tuple[dict[str, str], int, Degradation]) -> None:
        self.counters, self.depth, self.state = snapshot

    def num(self, name: str) -> float:
        try:
            return float(self.counters.get(name) or 0)
        except ValueError:
            return 0.0

    def collect(self):
        yield GaugeMetricFamily("sluice_redis_up", "1 while Redis answers.", value=1)
        outcomes = CounterMetricFamily("sluice_requests", "Admission outcomes.", labels=["status"])
        for status in STATUSES:
            outcomes.add_metric([status], self.num(f"requests:{status}"))
        yield outcomes
        reasons = CounterMetricFamily(
            "sluice_requests_by_reason",
            "Requests rejected or timed out in line, by reason.",
            labels=["status", "reason"],
        )
        for status, names in REASONS.items():
            for reason in names:
                reasons.add_metric([status, reason], self.num(f"requests:{status}:{reason}"))
        yield reasons
        buckets, cumulative = [], 0.0
        for bound in LATENCY_BUCKETS_MS:
            cumulative += self.num(f"latency:{bound}")
            buckets.append((f"{bound / 1000:g}", cumulative))
        buckets.append(("+Inf", cumulative + self.num("latency:inf")))
        yield HistogramMetricFamily(
            "sluice_admission_latency_seconds",
            "From submission to the admission decision.",
            buckets=buckets,
            sum_value=self.num("latency_sum_ms") / 1000,
        )
        gauges = [
            ("sluice_queue_depth", "Requests waiting in the admission queue.", self.depth),
            ("sluice_degradation_level", "Degradation level in force (0-3).", self.state.level),
            (
                "sluice_workers_live",
                "Healthy workers with a fresh heartbeat.",
                self.num("gauge:workers"),
            ),
            (
                "sluice_worker_slots",
                "Concurrent answers the live workers offer.",
                self.num("gauge:slots"),
            ),
            (
                "sluice_requests_running",
                "Requests dispatched and not finished.",
                self.num("gauge:running"),
            ),
            (
                "sluice_service_seconds",
                "Average answer time used for ETAs.",
                self.num("gauge:service_seconds"),
            ),
        ]
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(name, help_text, value=float(value))
        signals = GaugeMetricFamily(
            "sluice_degradation_signal",
            "Each degradation signal as a ratio of its threshold.",
            labels=["signal"],
        )
        for signal, value in self.state.signals.items():
            signals.add_metric([signal], float(value))
        yield signals
        yield from estimate_gauges(self.counters)
        tokens = CounterMetricFamily(
            "sluice_plan_tokens", "Real tokens (prompt + answer) used, per plan.", labels=["plan"]
        )
        for field, value in sorted(self.counters.items()):
            if field.startswith("tokens:"):
                tokens.add_metric([field[7:]], float(value))
        yield tokens


def estimate_gauges(counters: dict[str, str]):
    """The answer-length estimator's recent error, learned and old rule side by side."""
    figures = estimate_figures(counters)
    median = GaugeMetricFamily(
        "sluice_estimate_error_median",
        "Median |predicted - real| / real answer tokens, recent answers.",
        labels=["estimator"],
    )
    under = GaugeMetricFamily(
        "sluice_estimate_underestimated_share",
        "Share of recent answers predicted at under half their length.",
        labels=["estimator"],
    )
    for name, ape, share in (
        ("learned", figures.median_ape, figures.under_half),
        ("max_tokens rule", figures.rule_median_ape, figures.rule_under_half),
    ):
        if ape is not None:
            median.add_metric([name], ape)
            under.add_metric([name], share or 0.0)
    yield median
    yield under
