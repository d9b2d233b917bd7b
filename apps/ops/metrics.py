"""`/metrics` in the Prometheus text format, for staff sessions or `Authorization: Bearer
$METRICS_TOKEN`. The dispatcher keeps its counters in Redis, so any web replica can answer."""

from __future__ import annotations

import hmac

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from apps.admission.degradation import Degradation
from apps.admission.metrics import LATENCY_BUCKETS_MS, STATUSES
from apps.admission.selectors import admission_counters, degradation_get, queue_depth

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
    try:
        body = render(admission_counters(), queue_depth(), degradation_get())
    except redis.RedisError:
        body = "# Redis unreachable\nsluice_redis_up 0\n"
        return HttpResponse(body, status=503, content_type=CONTENT_TYPE)
    return HttpResponse(body, content_type=CONTENT_TYPE)


def render(counters: dict[str, str], depth: int, state: Degradation) -> str:
    def num(name: str) -> float:
        return float(counters.get(name) or 0)

    lines = ["sluice_redis_up 1"]
    lines += ["# HELP sluice_requests_total Admission outcomes.",
              "# TYPE sluice_requests_total counter"]  # fmt: skip
    lines += [f'sluice_requests_total{{status="{s}"}} {num(f"requests:{s}"):g}' for s in STATUSES]
    lines += ["# HELP sluice_admission_latency_seconds From submission to the admission decision.",
              "# TYPE sluice_admission_latency_seconds histogram"]  # fmt: skip
    cumulative = 0.0
    for bound in LATENCY_BUCKETS_MS:
        cumulative += num(f"latency:{bound}")
        lines.append(f'sluice_admission_latency_seconds_bucket{{le="{bound / 1000:g}"}} '
                     f"{cumulative:g}")  # fmt: skip
    cumulative += num("latency:inf")
    lines.append(f'sluice_admission_latency_seconds_bucket{{le="+Inf"}} {cumulative:g}')
    lines.append(f"sluice_admission_latency_seconds_sum {num('latency_sum_ms') / 1000:g}")
    lines.append(f"sluice_admission_latency_seconds_count {num('latency_count'):g}")
    gauges = [
        ("sluice_queue_depth", "Requests waiting in the admission queue.", depth),
        ("sluice_degradation_level", "Degradation level in force (0-3).", state.level),
        ("sluice_workers_live", "Healthy workers with a fresh heartbeat.", num("gauge:workers")),
        ("sluice_worker_slots", "Concurrent generations the live workers offer.",
         num("gauge:slots")),
        ("sluice_requests_running", "Requests dispatched and not finished.", num("gauge:running")),
        ("sluice_service_seconds", "Average generation time used for ETAs.",
         num("gauge:service_seconds")),
    ]  # fmt: skip
    for name, help_text, value in gauges:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
    lines += ["# HELP sluice_plan_tokens_total Real tokens (prompt + answer) used, per plan.",
              "# TYPE sluice_plan_tokens_total counter"]  # fmt: skip
    for field, value in sorted(counters.items()):
        if field.startswith("tokens:"):
            lines.append(f'sluice_plan_tokens_total{{plan="{field[7:]}"}} {float(value):g}')
    return "\n".join(lines) + "\n"
