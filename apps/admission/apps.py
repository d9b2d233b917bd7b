from __future__ import annotations

import os

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "apps.admission"
    label = "admission"

    def ready(self) -> None:
        from apps.admission import callers

        callers.connect()  # the API callers' cache follows keys, users and plans
        if os.environ.get("SLUICE_PROCESS") == "web":  # a web server (core/serve.py)
            # Its own CPU share, one of the degradation signals the dispatcher computes.
            from apps.admission.degradation import WebCpuPublisher
            from core.redis_client import get_redis, keys

            WebCpuPublisher(client_for=get_redis, keys_for=keys).start()
