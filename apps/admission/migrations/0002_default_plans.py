from __future__ import annotations

from django.db import migrations

# One plan: with no heavier plan to protect, degradation never sheds anyone until an operator
# adds one (docs/admission.md suggests a "pro" plan).
PLANS = [
    # slug, name, default, rpm, burst, tpm, burst tokens, per day, concurrent, wait, cap, weight
    ("free", "Free", True, 20, 10, 20_000, 20_000, 500_000, 2, 120, 1024, 1.0),
]


def create(apps, schema_editor):
    Plan = apps.get_model("admission", "Plan")
    DegradationSettings = apps.get_model("admission", "DegradationSettings")
    for slug, name, default, rpm, burst, tpm, btok, tpd, conc, wait, cap, weight in PLANS:
        Plan.objects.get_or_create(slug=slug, defaults=dict(
            name=name, is_default=default, requests_per_minute=rpm, burst_requests=burst,
            tokens_per_minute=tpm, burst_tokens=btok, tokens_per_day=tpd, max_concurrent=conc,
            max_queue_wait_seconds=wait, max_tokens_cap=cap, priority_weight=weight,
            cost_weights={"chat": 1, "report": 5},
        ))
    if not DegradationSettings.objects.exists():
        DegradationSettings.objects.create()


class Migration(migrations.Migration):
    dependencies = [("admission", "0001_initial")]
    operations = [migrations.RunPython(create, migrations.RunPython.noop)]
