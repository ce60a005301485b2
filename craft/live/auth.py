"""Who is on a websocket: the Django session cookie, resolved once when the socket connects.

Channels' `AuthMiddlewareStack` does the same job, but its session layer wraps `send` and
inspects the session on every outgoing message (to save it on HTTP responses), which costs
microseconds on each of the thousands of frames a turn streams, and it looks the user up on
asgiref's one shared thread. This middleware looks the user up on `craft.storage.db.db_calls`
and passes `send` through untouched. The checks are Django's own
(`django.contrib.auth.get_user`): the session's auth hash must match (a password change signs
other sessions out) and the backend refuses inactive users.
"""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http.cookie import parse_cookie

from craft.storage.db import db_calls


def _resolve(session_key: str | None) -> tuple[Any, Any]:
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(SimpleNamespace(session=store)), store  # type: ignore[arg-type]


class SessionAuthMiddleware:
    """Put `user`, `session` and `cookies` into a websocket's scope; leave `send` alone."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        cookie = b""
        for name, value in scope.get("headers", ()):
            if name == b"cookie":
                cookie = value
                break
        cookies = parse_cookie(cookie.decode("latin1"))
        user, session = await db_calls.run(_resolve, cookies.get(settings.SESSION_COOKIE_NAME))
        scope = {**scope, "cookies": cookies, "session": session, "user": user}
        return await self.inner(scope, receive, send)
