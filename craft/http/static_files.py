"""Static files answered again from memory, on the event loop, ahead of Django.

A session page asks for its style sheet and 27 scripts at once, and the browser has six
connections to the server: each file answered through Django (a request place, a request
thread, the whole middleware chain, WhiteNoise opening the file) kept one of them, and the
server's CPU, from the history requests behind (docs/history/performance-diary.md,
"Static files answered again from memory").

Django still makes every answer: the first plain `GET` of a path under `STATIC_URL` goes
through it (WhiteNoise, the security headers, everything), and a complete `200` answer is
kept, headers and body, and sent as it is to the next requests for that path. What could
make an answer differ from one request to the next goes through Django every time: a
conditional request (`If-None-Match`, `If-Modified-Since`: Django answers 304), a `Range`,
any method but `GET` and `HEAD`. Answers are kept apart by the request's scheme (HSTS is sent
over HTTPS only) and by its `Accept-Encoding` when the answer varies with it (at most
`VARIANTS` of a path). An answer that sets a cookie, varies with anything else, or is larger
than `LARGEST`, is not kept. Off under `DEBUG`, where files change on disk while the server
runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

LARGEST = 4 * 1024 * 1024  # bytes of one kept answer's body
VARIANTS = 4  # answers kept for one path and scheme, by Accept-Encoding
# The request headers an answer may vary with and still be kept.
VARY_KEPT = {b"accept-encoding"}
# Request headers under which Django may answer otherwise than with the whole file.
PASS_THROUGH = {b"if-none-match", b"if-modified-since", b"range"}


class KeptAnswer:
    """One complete answer of Django's, and the request headers its `Vary` names."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        vary = b",".join(value for name, value in headers if name.lower() == b"vary")
        self.varies = tuple(sorted({v.strip().lower() for v in vary.split(b",") if v.strip()}))


class StaticFiles:
    """ASGI: answer `GET` and `HEAD` under `STATIC_URL` from answers Django made before."""

    def __init__(self, app: App) -> None:
        self.app = app
        prefix = "/" + settings.STATIC_URL.strip("/") + "/"
        self.prefix = prefix if settings.STATIC_URL and prefix != "//" else None
        self.enabled = self.prefix is not None and not settings.DEBUG
        # (path, scheme) -> the answer kept for it; one per such pair, so that the headers
        # its `Vary` names are known before the key that includes them is looked up.
        self._first: dict[tuple[str, str], KeptAnswer] = {}
        self._kept: dict[tuple[Any, ...], KeptAnswer] = {}
        self._variants: dict[tuple[str, str], int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._may_keep(scope):
            await self.app(scope, receive, send)
            return
        base = (scope["path"], scope.get("scheme", "http"))
        first = self._first.get(base)
        kept = None if first is None else self._kept.get(_key(base, first.varies, scope))
        if kept is not None:
            await _send(kept, scope, send)
            return
        if scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, self._keeping(base, scope, send))

    def _may_keep(self, scope: Scope) -> bool:
        if not self.enabled or scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            return False
        if not scope["path"].startswith(self.prefix) or scope.get("query_string"):
            return False
        return not any(name.lower() in PASS_THROUGH for name, _ in scope.get("headers", ()))

    def _keeping(self, base: tuple[str, str], scope: Scope, send: Send) -> Send:
        """Return a `send` that passes Django's answer on and keeps it once it is complete."""
        start: Message | None = None
        parts: list[bytes] = []
        size = 0

        async def keeping(message: Message) -> None:
            nonlocal start, size
            await send(message)
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body" and start is not None:
                body = message.get("body", b"")
                size += len(body)
                if size > LARGEST:
                    start = None  # too large to keep: passed on only
                    return
                parts.append(body)
                if not message.get("more_body", False):
                    self._keep(base, scope, start, b"".join(parts))

        return keeping

    def _keep(self, base: tuple[str, str], scope: Scope, start: Message, body: bytes) -> None:
        headers = [(bytes(name), bytes(value)) for name, value in start.get("headers", ())]
        if start["status"] != 200 or any(name.lower() == b"set-cookie" for name, _ in headers):
            return
        answer = KeptAnswer(200, headers, body)
        if not set(answer.varies) <= VARY_KEPT:
            return
        first = self._first.setdefault(base, answer)
        if first.varies != answer.varies:
            return
        if self._variants.get(base, 0) >= VARIANTS:
            return
        key = _key(base, answer.varies, scope)
        if key not in self._kept:
            self._variants[base] = self._variants.get(base, 0) + 1
        self._kept[key] = answer


def _key(base: tuple[str, str], varies: tuple[bytes, ...], scope: Scope) -> tuple[Any, ...]:
    if not varies:
        return base
    headers = {name.lower(): value for name, value in scope.get("headers", ())}
    return (*base, *(headers.get(name, b"") for name in varies))


async def _send(answer: KeptAnswer, scope: Scope, send: Send) -> None:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    body = b"" if scope["method"] == "HEAD" else answer.body
    await send({"type": "http.response.body", "body": body})
