"""The websocket Origin check: cross-site websocket hijacking protection.

A browser sends the page's origin with every websocket handshake, and a page on another site
can open a websocket to Craft carrying the user's cookies. So a handshake is accepted only
from an origin that is Craft itself, compared as scheme, host and port, the same rule as
Django's CSRF Origin check:

* the origin the handshake was sent to: the `Host` header (which must be one of
  `ALLOWED_HOSTS`) with `https` when the connection is secure (`wss`, or
  `SECURE_PROXY_SSL_HEADER` from a TLS proxy) and `http` otherwise; or
* one of `CSRF_TRUSTED_ORIGINS` (`https://*.example.com` allows the subdomains of
  example.com, with that scheme and port).

A missing Origin, `null`, or any other origin is refused during the handshake (HTTP 403).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

Origin = tuple[str, str, int]  # scheme, host, port
DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origin(text: str) -> Origin | None:
    """Return (scheme, host, port) of an http(s) origin, defaulting the port; None if malformed."""
    try:
        parts = urlsplit(text.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def own_origin(scope: dict[str, Any], headers: dict[bytes, bytes]) -> Origin | None:
    """Return the origin this handshake was sent to, if its host is an allowed one."""
    raw_host = headers.get(b"host", b"").decode("latin1").strip().lower()
    if not raw_host and scope.get("server"):
        host, port = scope["server"]
        raw_host = f"{host}:{port}" if port else str(host)
    domain, port_text = split_domain_port(raw_host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if is_secure(scope, headers) else "http"
    if not port_text:
        return scheme, domain.strip("[]"), DEFAULT_PORTS[scheme]
    return scheme, domain.strip("[]"), int(port_text)


def is_secure(scope: dict[str, Any], headers: dict[bytes, bytes]) -> bool:
    """Return whether the browser reached us over TLS (directly, or through a trusted proxy)."""
    if scope.get("scheme") in ("wss", "https"):
        return True
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        header = meta_name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin1")
        value = headers.get(header, b"").decode("latin1").split(",")[0].strip()
        return value == secure_value
    return False


def trusted(origin: Origin) -> bool:
    """Return whether `origin` is one of CSRF_TRUSTED_ORIGINS (wildcard subdomains included)."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        allowed = parse_origin(entry.replace("://*.", "://", 1) if wildcard else entry)
        if allowed is None or allowed[0] != scheme or allowed[2] != port:
            continue
        if host == allowed[1] or (wildcard and is_same_domain(host, "." + allowed[1])):
            return True
    return False


def origin_allowed(scope: dict[str, Any]) -> bool:
    headers = dict(scope.get("headers") or [])
    raw = headers.get(b"origin")
    origin = parse_origin(raw.decode("latin1")) if raw else None
    if origin is None:
        return False
    return origin == own_origin(scope, headers) or trusted(origin)


class OriginCheck:
    """ASGI middleware: refuse websocket handshakes from origins that are not Craft's own."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
