"""The websocket's origin check: scheme, host and port, as browsers define an origin.

A page may open a websocket to any site, and the browser sends that site's cookies along; only
the Origin header tells who opened it. Comparing host names alone let a page on another port or
scheme of the same host (another app on 127.0.0.1:9999, or plain http beside https) open an
authenticated socket. Allowed: the socket's own origin (ws→http, wss→https, and the Host
header's host and port) and CSRF_TRUSTED_ORIGINS, the origins Django already trusts for forms.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

log = logging.getLogger("sluice.security")

Origin = tuple[str, str, int]  # scheme, host, port

DEFAULT_PORTS = {"http": 80, "https": 443}
REFUSED_CODE = 4403


def parse_origin(value: str) -> Origin | None:
    """`scheme://host[:port]` as (scheme, host, port); None for anything else ("null", paths)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin1")
    return None


def _allowed_hosts() -> list[str]:
    hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not hosts:
        return [".localhost", "127.0.0.1", "[::1]"]  # what Django's HTTP side allows then
    return hosts


def own_origin(scope: dict) -> Origin | None:
    """The origin of the page the socket belongs to, as Django would see it for a request
    (behind a TLS proxy, SECURE_PROXY_SSL_HEADER tells the scheme); None when the Host header
    is missing or not an allowed host."""
    secure = scope.get("scheme") in ("wss", "https")
    proxy_header = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        name, expected = proxy_header
        asgi_name = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        forwarded = _header(scope, asgi_name)
        if forwarded is not None:
            secure = forwarded.split(",", 1)[0].strip() == expected
    host = _header(scope, b"host")
    if not host:
        return None
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, _allowed_hosts()):
        return None
    return parse_origin(("https://" if secure else "http://") + host)


def trusted(origin: Origin) -> bool:
    """Whether CSRF_TRUSTED_ORIGINS names `origin`; `https://*.example.org` matches the domain
    and its subdomains, as it does for Django's CSRF check."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        pattern = parse_origin(entry)
        if pattern is None or (pattern[0], pattern[2]) != (scheme, port):
            continue
        if pattern[1].startswith("*."):
            if is_same_domain(host, pattern[1][1:]):
                return True
        elif pattern[1] == host:
            return True
    return False


def origin_allowed(scope: dict) -> bool:
    header = _header(scope, b"origin")
    if header is None:
        # Browsers always send Origin on websockets; a client that does not is no browser page,
        # but with a session cookie it would still act as that user.
        return _header(scope, b"cookie") is None
    origin = parse_origin(header)
    if origin is None:
        return False
    return origin == own_origin(scope) or trusted(origin)


class _Refuse(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.close(code=REFUSED_CODE)


class SameOriginValidator:
    """ASGI middleware: websockets from an origin other than the site's own (or a trusted one)
    are closed before they are accepted (daphne answers the handshake with 403)."""

    def __init__(self, application) -> None:
        self.application = application
        self.refuse = _Refuse.as_asgi()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            log.warning(
                "websocket from origin %r refused (host %r)",
                _header(scope, b"origin"),
                _header(scope, b"host"),
            )
            return await self.refuse(scope, receive, send)
        return await self.application(scope, receive, send)
