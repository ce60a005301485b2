"""The app as the browser tests serve it: `craft.asgi.application` behind a fault injector.

A browser test runs daphne in another process, so it cannot patch code there. This ASGI
wrapper sits in front of the real application and disturbs it from outside, the way a flaky
network or a slow server would: it can fail, slow down or hang session loads (the page's
`GET /api/sessions/<id>/events/`), count them, and drop a session's websockets (its
terminals' too). The product code knows nothing about it. Tests drive it over HTTP under
`/_faults/` (see `LiveServer`).

    daphne tests.browser.faults:application
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter, defaultdict
from typing import Any
from urllib.parse import parse_qs

from craft.asgi import application as craft_application

LOAD_PATH = re.compile(r"^/api/sessions/(?P<session>[0-9a-f-]{36})/events/$")
# A session's sockets: its own, and its terminals'.
SOCKET_PATH = re.compile(r"^/ws/sessions/(?P<session>[0-9a-f-]{36})/(terminals/)?$")
# A hung load waits this long at most (the page gives up well before).
HANG_SECONDS = 60.0
# Close code of a dropped socket: any code the page does not treat as final.
DROP_CODE = 4000

state: dict[str, float] = {"fail_loads": 0, "hang_loads": 0, "load_delay": 0.0, "hold_loads": 0}
loads: Counter[str] = Counter()
held: list[asyncio.Event] = []  # loads held until `release/` (with hold_loads set)
sockets: defaultdict[str, set[asyncio.Event]] = defaultdict(set)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope.get("path", "")
    if scope["type"] == "http" and path.startswith("/_faults/"):
        await _control(scope, receive, send)
        return
    if scope["type"] == "http" and scope["method"] == "GET":
        match = LOAD_PATH.match(path)
        if match and await _disturb_load(match["session"], receive, send):
            return
    if scope["type"] == "websocket":
        match = SOCKET_PATH.match(path)
        if match:
            await _droppable_socket(match["session"], scope, receive, send)
            return
    await craft_application(scope, receive, send)


async def _disturb_load(session: str, receive: Any, send: Any) -> bool:
    """Count a session load and apply the configured fault; True if it was answered here."""
    loads[session] += 1
    if state["load_delay"]:
        await asyncio.sleep(state["load_delay"])
    if state["hold_loads"]:
        release = asyncio.Event()
        held.append(release)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), HANG_SECONDS)
    if state["hang_loads"] > 0:
        state["hang_loads"] -= 1
        # Never answer; stop when the browser gives up (http.disconnect) or after a while.
        try:
            while (await asyncio.wait_for(receive(), HANG_SECONDS))["type"] != "http.disconnect":
                pass
        except TimeoutError:
            pass
        return True
    if state["fail_loads"] > 0:
        state["fail_loads"] -= 1
        body = {"error": {"code": "unavailable", "message": "load failed (injected fault)"}}
        await _json(send, body, status=503)
        return True
    return False


async def _droppable_socket(session: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Run the websocket through the app; on a drop, close it to both sides."""
    dropped = asyncio.Event()
    sockets[session].add(dropped)
    closed = False

    async def app_receive() -> dict[str, Any]:
        nonlocal closed
        if closed:
            return {"type": "websocket.disconnect", "code": DROP_CODE}
        waiter = asyncio.ensure_future(receive())
        drop = asyncio.ensure_future(dropped.wait())
        done, _ = await asyncio.wait({waiter, drop}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            drop.cancel()
            return waiter.result()
        waiter.cancel()
        closed = True
        await send({"type": "websocket.close", "code": DROP_CODE})
        return {"type": "websocket.disconnect", "code": DROP_CODE}

    async def app_send(message: dict[str, Any]) -> None:
        if not closed:
            await send(message)

    try:
        await craft_application(scope, app_receive, app_send)
    finally:
        sockets[session].discard(dropped)


async def _control(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    fields = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
    path = scope["path"][len("/_faults/") :]
    if path == "configure/":
        if fields.get("reset"):
            state.update(fail_loads=0, hang_loads=0, load_delay=0.0, hold_loads=0)
            loads.clear()
        for name in ("fail_loads", "hang_loads", "load_delay", "hold_loads"):
            if name in fields:
                state[name] = float(fields[name])
        await _json(send, {**state, "loads": dict(loads)})
    elif path == "release/":
        state["hold_loads"] = 0
        for release in held:
            release.set()
        held.clear()
        await _json(send, {"released": True})
    elif path == "loads/":
        await _json(send, {"loads": dict(loads)})
    elif path.startswith("drop/"):
        session = path[len("drop/") :].strip("/")
        for event in list(sockets.get(session, ())):
            event.set()
        await _json(send, {"dropped": session})
    else:
        await _json(send, {"error": "unknown fault control"}, status=404)


async def _json(send: Any, body: dict[str, Any], status: int = 200) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": payload})
