"""How the operations page writes durations, shares and stream times."""

from __future__ import annotations

import datetime

from django import template

register = template.Library()


@register.filter
def ms(value) -> str:
    """1234 → "1.23 s", 87 → "87 ms"; "-" without a figure."""
    if value is None or value == "":
        return "-"
    value = float(value)
    if value >= 60_000:
        return f"{value / 60_000:.1f} min"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


@register.filter
def seconds(value) -> str:
    if value is None or value == float("inf"):
        return "-"
    return ms(float(value) * 1000)


@register.filter
def pct(value, digits: int = 0) -> str:
    if value is None or value == "":
        return "-"
    return f"{float(value) * 100:.{int(digits)}f} %"


@register.filter
def stream_time(entry_id: str) -> str:
    """A stream entry's id as the UTC time Redis added it."""
    try:
        at = int(str(entry_id).partition("-")[0]) / 1000
    except ValueError:
        return ""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


@register.filter
def get(mapping, key):
    return (mapping or {}).get(str(key))
