"""The preview origin's ASGI application: an app in a sandbox, proxied for its owner only.

`PreviewDispatch` sits in front of Craft's whole application: a request or websocket whose
Host is a preview host (`origin`) goes to the preview, everything else to Craft. So nothing of
Craft (pages, API, admin, static files, its websockets, its session cookie) is ever served on
a preview host, and the preview answers nothing on Craft's own.

On a preview host:

* `ENTRY_PATH?token=…` trades the page's token (`passes`) for the preview origin's cookie and
  redirects to the app's `/`;
* every other request and websocket must show that cookie, for this very session and port, of
  a user who still owns the session and is active; else a 403 page that says to open the
  preview from Craft. Websockets must also come from the preview's own origin;
* the request goes to the app over HTTP/1.1 on a connection of its own (the backend's
  `preview_connect`: the sandbox's loopback, or the pod's address), streamed both ways, never
  held whole. Hop-by-hop headers are dropped; Host becomes `localhost:<port>` (what dev servers
  accept by default), the preview host goes in X-Forwarded-Host, and an Origin of the preview
  becomes `http://localhost:<port>` to match. Craft's cookie is taken out of the Cookie header.
  Responses keep the app's headers (its own policy included) and get a second policy,
  `frame-ancestors` Craft's origin only;
* websockets are relayed message by message (subprotocols passed on, close codes carried both
  ways); an app that does not answer gives a 502 page naming the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

from craft.models import Session
from craft.preview import frames
from craft.preview.origin import PreviewHost, PreviewOrigin, preview_origin
from craft.preview.passes import (
    COOKIE,
    COOKIE_SECONDS,
    ENTRY_PATH,
    Pass,
    make_cookie,
    read_cookie,
    redeem_token,
)
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PAGE_STYLE = (
    "<style>body { font: 15px/1.5 system-ui, sans-serif; margin: 1.5rem; color: #1d2433; }"
    " h1 { font-size: 1.3rem; }</style>"
)
OPEN_FROM_CRAFT = "Open this preview from Craft: the Preview tab of its session."
CONNECT_SECONDS = 10.0
# An app may take its time (a dev server compiling on first load).
HEADERS_SECONDS = 300.0
MAX_HEAD = 64 << 10  # the app's status line and headers
CHUNK = 1 << 16
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}
# Not passed to the app: the proxy speaks its own websocket handshake, and answers Expect.
REQUEST_DROPPED = HOP_BY_HOP | {
    b"host",
    b"expect",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
}
# Close codes an endpoint may send (RFC 6455 7.4): the browser's are carried to the app as
# they are, others (none given, the connection lost) as 1001 (going away).
SENDABLE_CLOSE = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, *range(3000, 5000)}
# The app's codes daphne can send on (autobahn sends 1000 and 3000-4999 only); others, and an
# app gone without closing, reach the browser as 1000.
DAPHNE_CLOSE = {1000, *range(3000, 5000)}
# The close code of a preview websocket whose user lost the session, as Craft's sockets have.
CLOSE_FORBIDDEN = 4403


class PreviewDispatch:
    """Send preview hosts' requests to the preview, all others to `craft` (see the module)."""

    def __init__(self, craft: ASGIApp) -> None:
        self.craft = craft

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = preview_origin()
        if origin is not None and scope["type"] in ("http", "websocket"):
            target = origin.match(_header(scope, b"host"))
            if target is not None:
                preview = Preview(origin, target, scope, receive, send)
                if scope["type"] == "http":
                    await preview.http()
                else:
                    await preview.websocket()
                return
        if origin is not None and scope["type"] == "websocket" and _from_preview(origin, scope):
            # Whatever CSRF_TRUSTED_ORIGINS says: a preview's page never opens Craft's sockets.
            await WebsocketDenier()(scope, receive, send)
            return
        await self.craft(scope, receive, send)


def _from_preview(origin: PreviewOrigin, scope: Scope) -> bool:
    """Return whether a handshake's Origin is a preview origin."""
    parts = urlsplit(_header(scope, b"origin").strip())
    return origin.match(parts.netloc) is not None


class Refused(Exception):
    """What the preview answers instead of the app: a status and a sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def _owned_sandbox(grant: Pass) -> Sandbox | None:
    """Return the sandbox of the pass's session if its user still owns it and is active."""
    session = (
        Session.objects.filter(pk=grant.session, owner_id=grant.user_id, owner__is_active=True)
        .select_related("sandbox")
        .only("id", "sandbox")
        .first()
    )
    return session.sandbox if session is not None else None


owned_sandbox = db_sync_to_async(_owned_sandbox)
# Connections to apps are made on threads of their own: a pod that does not answer holds one
# for CONNECT_SECONDS, never a thread the rest of the server waits for.
_connecting = ThreadPoolExecutor(max_workers=16, thread_name_prefix="craft-preview-connect")


class Preview:
    """One request or websocket on a preview host."""

    def __init__(
        self,
        origin: PreviewOrigin,
        target: PreviewHost,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        self.origin = origin
        self.target = target
        self.scope = scope
        self.receive = receive
        self.send = send
        self.own_origin = origin.url(target.session, target.port)
        self.app_host = f"localhost:{target.port}"
        self.started = False  # whether the answer's head went to the browser

    # --- who may see it -------------------------------------------------------------------

    def _cookie_pass(self) -> Pass | None:
        raw = _header(self.scope, b"cookie")
        try:
            cookies = SimpleCookie(raw)
        except CookieError:
            return None
        morsel = cookies.get(COOKIE)
        grant = read_cookie(morsel.value) if morsel is not None else None
        if grant is None or (grant.session, grant.port) != (
            self.target.session,
            self.target.port,
        ):
            return None
        return grant

    async def _admitted(self) -> tuple[Pass, Sandbox]:
        grant = self._cookie_pass()
        if grant is None:
            raise Refused(403, OPEN_FROM_CRAFT)
        sandbox = await owned_sandbox(grant)
        if sandbox is None:
            raise Refused(403, "This preview is not yours to see (any more).")
        return grant, sandbox

    async def _connect(self, sandbox: Sandbox) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        port = self.target.port
        loop = asyncio.get_running_loop()
        try:
            connection = await loop.run_in_executor(
                _connecting, sandbox_services.preview_connect, sandbox, port, CONNECT_SECONDS
            )
        except SandboxError as exc:
            said = str(exc) or f"nothing answers on port {port} in the sandbox"
            raise Refused(502, f"{said[0].upper()}{said[1:]}. Start the app, then reload.") from exc
        connection.setblocking(False)
        return await asyncio.open_connection(sock=connection, limit=MAX_HEAD)

    def _request_head(self, method: str, extra: list[tuple[str, str]]) -> bytes:
        """Return the request line and headers for the app."""
        path = self.scope.get("raw_path") or self.scope["path"].encode("utf-8")
        query = self.scope.get("query_string") or b""
        target = path + (b"?" + query if query else b"")
        lines = [method.encode("ascii") + b" " + target + b" HTTP/1.1"]
        lines.append(b"host: " + self.app_host.encode("ascii"))
        connection_named = {
            name.strip().lower()
            for key, value in self.scope["headers"]
            if key == b"connection"
            for name in value.split(b",")
        }
        for key, value in self.scope["headers"]:
            if key in REQUEST_DROPPED or key in connection_named:
                continue
            if key == b"cookie":
                value = _without_cookie(value)
                if not value:
                    continue
            elif key == b"origin" and value.decode("latin-1") == self.own_origin:
                value = f"http://{self.app_host}".encode("ascii")
            lines.append(key + b": " + value)
        lines.append(b"x-forwarded-host: " + _header(self.scope, b"host").encode("latin-1"))
        lines.append(b"x-forwarded-proto: " + self.origin.scheme.encode("ascii"))
        lines.extend(f"{key}: {value}".encode("latin-1") for key, value in extra)
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def _frame_ancestors(self, grant: Pass) -> tuple[bytes, bytes]:
        return (b"content-security-policy", f"frame-ancestors {grant.craft_origin}".encode())

    # --- HTTP -----------------------------------------------------------------------------

    async def http(self) -> None:
        try:
            if self.scope["path"] == ENTRY_PATH:
                await self._enter()
                return
            grant, sandbox = await self._admitted()
            reader, writer = await self._connect(sandbox)
        except Refused as refused:
            await self._page(refused.status, refused.message)
            return
        try:
            await self._relay_http(grant, reader, writer)
        except (OSError, asyncio.IncompleteReadError) as exc:
            # The app closed the connection while it was being sent the request.
            logger.info("preview %s: the app went away: %s", self.target.port, exc)
            if not self.started:
                await self._page(502, f"The app on port {self.target.port} went away.")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _enter(self) -> None:
        """Trade a token for the preview origin's cookie, then go to the app's `/`."""
        token = parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get("token", [""])
        grant = redeem_token(token[0])
        if grant is None or (grant.session, grant.port) != (
            self.target.session,
            self.target.port,
        ):
            raise Refused(403, f"This link has expired or was used already. {OPEN_FROM_CRAFT}")
        if await owned_sandbox(grant) is None:
            raise Refused(403, "This preview is not yours to see (any more).")
        cookie = f"{COOKIE}={make_cookie(grant)}; Path=/; Max-Age={COOKIE_SECONDS}; HttpOnly"
        cookie += "; " + "; ".join(self.cookie_attributes())
        await self.send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", b"/"),
                    (b"set-cookie", cookie.encode("latin-1")),
                    (b"cache-control", b"no-store"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": b""})

    def cookie_attributes(self) -> list[str]:
        """Return the cookie's attributes besides its path, age and HttpOnly.

        The preview is shown in an iframe of Craft's page, another site: a cookie is sent
        there only with SameSite=None, which browsers take only with Secure (https, or
        `*.localhost`, which Chromium counts as secure: `make run`). Partitioned (CHIPS) keeps
        the iframe's cookie to Craft's top-level site, and lets it work where third-party
        cookies are blocked (Chromium as the tests run it drops an unpartitioned one); a tab of
        its own gets a cookie of its own. On plain http under
        another name the cookie is SameSite=Lax: the preview then works in a tab of its own.
        """
        host = _header(self.scope, b"host").rsplit(":", 1)[0]
        if self.origin.secure or host.endswith(".localhost"):
            return ["Secure", "SameSite=None", "Partitioned"]
        return ["SameSite=Lax"]

    async def _relay_http(
        self, grant: Pass, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        method = self.scope["method"]
        first = await self.receive()
        body, more = first.get("body", b""), first.get("more_body", False)
        length = _header(self.scope, b"content-length")
        extra = [("connection", "close")]
        chunked = bool(more or body) and not length
        if length:
            extra.append(("content-length", length))
        elif chunked:
            extra.append(("transfer-encoding", "chunked"))
        writer.write(self._request_head(method, extra))
        while True:
            if body:
                writer.write(b"%x\r\n%s\r\n" % (len(body), body) if chunked else body)
                await writer.drain()
            if not more:
                break
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
            body, more = message.get("body", b""), message.get("more_body", False)
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

        # The answer, streamed; the browser going away stops it.
        disconnected = asyncio.ensure_future(self._disconnected())
        relay = asyncio.ensure_future(self._relay_response(grant, method, reader))
        try:
            await asyncio.wait({disconnected, relay}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (disconnected, relay):
                task.cancel()
        if relay.done() and not relay.cancelled() and relay.exception() is not None:
            raise relay.exception()  # type: ignore[misc]

    async def _disconnected(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _relay_response(self, grant: Pass, method: str, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                status, headers = await asyncio.wait_for(_read_head(reader), HEADERS_SECONDS)
                if status >= 200 or status == 101:
                    break  # 1xx (100 Continue, 103 Early Hints): not passed on
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            await self._page(502, f"The app on port {self.target.port} gave no valid answer.")
            return
        except TimeoutError:
            await self._page(504, f"The app on port {self.target.port} did not answer in time.")
            return
        names = {key for key, _ in headers}
        length_text = next((v for k, v in headers if k == b"content-length"), None)
        chunked = b"chunked" in b",".join(
            v.lower() for k, v in headers if k == b"transfer-encoding"
        )
        connection_named = {
            name.strip().lower()
            for key, value in headers
            if key == b"connection"
            for name in value.split(b",")
        }
        out = [
            (key, value)
            for key, value in headers
            if key not in HOP_BY_HOP and key not in connection_named
        ]
        if chunked:
            out = [(key, value) for key, value in out if key != b"content-length"]
        out.append(self._frame_ancestors(grant))
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": out})
        if method == "HEAD" or status in (204, 304) or status < 200:
            await self.send({"type": "http.response.body", "body": b""})
            return
        try:
            if chunked:
                await self._relay_chunked(reader)
            elif length_text is not None and b"content-length" in names:
                await self._relay_length(reader, int(length_text))
            else:
                while data := await reader.read(CHUNK):
                    await self.send({"type": "http.response.body", "body": data, "more_body": True})
        except (asyncio.IncompleteReadError, ValueError, OSError):
            logger.info("preview %s: the app's answer ended early", self.target.port)
        await self.send({"type": "http.response.body", "body": b""})

    async def _relay_length(self, reader: asyncio.StreamReader, left: int) -> None:
        while left > 0:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def _relay_chunked(self, reader: asyncio.StreamReader) -> None:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # Trailers, if any, end with an empty line; not passed on.
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            await self._relay_length(reader, size)
            await reader.readexactly(2)

    async def _page(self, status: int, message: str) -> None:
        """Answer with a small page of the preview origin's own (not the app's)."""
        port = self.target.port
        body = (
            "<!doctype html><html lang=en><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Preview of port {port}</title>{PAGE_STYLE}"
            f"<body><h1>Preview of port {port}</h1><p>{html.escape(message)}</p></body></html>"
        ).encode()
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            # Its own style only; framed by Craft's page (or any: it shows nothing of the app).
            (b"content-security-policy", b"default-src 'none'; style-src 'unsafe-inline'"),
        ]
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    # --- websockets -----------------------------------------------------------------------

    async def websocket(self) -> None:
        await self.receive()  # websocket.connect
        try:
            if _header(self.scope, b"origin") != self.own_origin:
                # The cookie goes with a websocket from any page: only the preview's own may
                # use it (cross-site websocket hijacking).
                raise Refused(403, "not from the preview's own origin")
            grant, sandbox = await self._admitted()
            reader, writer = await self._connect(sandbox)
        except Refused as refused:
            logger.info("preview websocket refused: %s", refused.message)
            await self.send({"type": "websocket.close", "code": 1008})
            return
        try:
            subprotocol = await self._handshake(reader, writer)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            logger.info("preview %s: the app refused the websocket", self.target.port)
            await self.send({"type": "websocket.close"})
            writer.close()
            return
        await self.send({"type": "websocket.accept", "subprotocol": subprotocol})
        to_app = asyncio.ensure_future(self._browser_to_app(writer))
        to_browser = asyncio.ensure_future(self._app_to_browser(reader, writer))
        allowed = asyncio.ensure_future(self._while_allowed(grant))
        try:
            await asyncio.wait({to_app, to_browser, allowed}, return_when=asyncio.FIRST_COMPLETED)
            if allowed.done() and not allowed.cancelled() and allowed.exception() is None:
                # No longer the user's (or the user no longer active): as Craft's own sockets.
                await self.send({"type": "websocket.close", "code": CLOSE_FORBIDDEN})
        finally:
            for task in (to_app, to_browser, allowed):
                task.cancel()
            writer.close()

    async def _while_allowed(self, grant: Pass) -> None:
        """Return once the pass's user no longer owns the session or is no longer active,
        looked at every CRAFT_SOCKET_AUTH_CHECK_SECONDS (as Craft's own sockets are)."""
        while True:
            await asyncio.sleep(settings.CRAFT_SOCKET_AUTH_CHECK_SECONDS)
            if await owned_sandbox(grant) is None:
                return

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> str | None:
        key = frames.new_key()
        extra = [
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", key),
        ]
        offered = self.scope.get("subprotocols") or []
        if offered:
            extra.append(("sec-websocket-protocol", ", ".join(offered)))
        writer.write(self._request_head("GET", extra))
        await writer.drain()
        status, headers = await asyncio.wait_for(_read_head(reader), CONNECT_SECONDS)
        answer = dict(headers)
        accept = answer.get(b"sec-websocket-accept", b"").decode("latin-1")
        if status != 101 or accept != frames.accept_for(key):
            raise ValueError(f"the app answered {status}")
        chosen = answer.get(b"sec-websocket-protocol", b"").decode("latin-1").strip()
        if chosen and chosen not in offered:
            raise ValueError("the app chose a subprotocol it was not offered")
        return chosen or None

    async def _browser_to_app(self, writer: asyncio.StreamWriter) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "websocket.receive":
                if message.get("text") is not None:
                    writer.write(frames.encode(frames.TEXT, message["text"].encode("utf-8")))
                else:
                    writer.write(frames.encode(frames.BINARY, message.get("bytes") or b""))
                await writer.drain()
            elif message["type"] == "websocket.disconnect":
                code = message.get("code")
                code = code if code in SENDABLE_CLOSE else 1001
                with contextlib.suppress(OSError):
                    writer.write(frames.encode(frames.CLOSE, frames.close_payload(code)))
                    await writer.drain()
                return

    async def _app_to_browser(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        code: int | None = 1000
        try:
            while True:
                message = await frames.read_message(reader)
                if message.opcode == frames.TEXT:
                    text = message.payload.decode("utf-8")
                    await self.send({"type": "websocket.send", "text": text})
                elif message.opcode == frames.BINARY:
                    await self.send({"type": "websocket.send", "bytes": message.payload})
                elif message.opcode == frames.PING:
                    writer.write(frames.encode(frames.PONG, message.payload))
                    await writer.drain()
                elif message.opcode == frames.CLOSE:
                    code = frames.close_code(message.payload)
                    with contextlib.suppress(OSError):
                        writer.write(frames.encode(frames.CLOSE, message.payload[:2]))
                        await writer.drain()
                    break
        except (asyncio.IncompleteReadError, OSError):
            logger.info("preview %s: the app went away without closing", self.target.port)
        except (frames.FrameError, UnicodeDecodeError) as exc:
            logger.info(
                "preview %s: the app broke the websocket protocol: %s", self.target.port, exc
            )
        await self.send({"type": "websocket.close", "code": code if code in DAPHNE_CLOSE else 1000})


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[bytes, bytes]]]:
    """Return the status and headers (names lowercased) of the app's next answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1 answer")
    status = int(parts[1])
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise ValueError("a header line without a colon")
        headers.append((name.strip().lower(), value.strip()))
    return status, headers


def _without_cookie(header: bytes) -> bytes:
    """Return a Cookie header without the preview's own cookie (the app never sees it)."""
    kept = [
        part.strip()
        for part in header.split(b";")
        if part.strip() and part.strip().split(b"=", 1)[0] != COOKIE.encode()
    ]
    return b"; ".join(kept)
