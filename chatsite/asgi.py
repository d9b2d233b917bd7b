"""HTTP and websocket entry point, served by daphne (devstack.stack.web_command)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from chatsite.settings import process

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
process.mark_web()  # before the settings are read: web processes get the database pool
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (after Django setup)

from apps.api.handler import ApiHandler, route_api  # noqa: E402
from apps.streams.handshake import HandshakeDeadline  # noqa: E402
from apps.streams.ws_auth import SessionAuthMiddleware  # noqa: E402
from chatsite.routing import websocket_urlpatterns  # noqa: E402
from contract.gc_tuning import freeze_startup_objects  # noqa: E402
from core.daphne_tuning import (  # noqa: E402
    direct_messages,
    no_form_parsing,
    plain_websocket_debug_arguments,
    write_through,
)
from core.draining import Draining, drain_on_sigterm  # noqa: E402
from core.origin import SameOriginValidator  # noqa: E402
from core.request_threads import ReusedThreads, with_reused_threads  # noqa: E402

plain_websocket_debug_arguments()
no_form_parsing()
write_through()
direct_messages()
application = Draining(
    ProtocolTypeRouter(
        {
            "http": route_api(with_reused_threads(django_asgi_app, ReusedThreads()), ApiHandler()),
            "websocket": SameOriginValidator(
                HandshakeDeadline(SessionAuthMiddleware(URLRouter(websocket_urlpatterns)))
            ),
        }
    )
)


def _warm_up_retrieval() -> None:
    """Loads the embedding model in the background at startup, so the first question does not
    wait seconds for it."""
    import logging
    import threading

    from django.conf import settings

    if not settings.RAG_WARM_UP:
        return

    def load() -> None:
        from apps.rag.embeddings import warm_up

        try:
            warm_up()
        except Exception:  # retrieval then loads on first use, or answers without passages
            logging.getLogger("sluice").exception("embedding model warm-up failed")

    threading.Thread(target=load, name="rag-warm-up", daemon=True).start()


_warm_up_retrieval()
if os.environ.get("SLUICE_PROCESS") == "web":  # a web server (core/serve.py), not a test
    drain_on_sigterm(application)  # an upgrade's SIGTERM lets answers in flight end
    freeze_startup_objects()  # the whole application is built
