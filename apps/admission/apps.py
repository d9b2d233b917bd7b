from __future__ import annotations

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "apps.admission"
    label = "admission"

    def ready(self) -> None:
        from apps.admission import callers

        callers.connect()  # the API callers' cache follows keys, users and plans
