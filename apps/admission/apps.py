from __future__ import annotations

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "apps.admission"
    label = "admission"
