from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "apps.api"
    label = "api"
