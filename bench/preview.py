"""A preview's time to first byte through Craft's proxy, beside the app's own.

Run as root, in the configuration `make run` has as root: sandbox users, the jail, the
sandbox's own network and its budget, previews on the server's second port. The app is the
demo agent's `serve` (the standard library's `http.server`, in the sandbox).

* the app alone: a connection made inside the sandbox's network namespace (as Craft's proxy
  makes its own), `GET /` and the first byte of the answer: the floor;
* through the proxy: a connection to the preview origin (daphne's second port) with the
  preview's cookie, the same request and the first byte: the cookie checked, the session's
  ownership read from the database, a connection made into the sandbox, the request relayed
  and the answer's head relayed back. Target: within 10 ms of the floor.

Each round times one of each, in turns, each on a new connection; medians of the rounds.

    .venv/bin/python -m bench.preview [--rounds 200]
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
import urllib.parse
import uuid
from typing import Any

from .harness import Client, Figure, Site, median, percentile, run_alone

APP_PORT = 8080
REQUEST = "GET / HTTP/1.1\r\nHost: {host}\r\n{cookie}Connection: close\r\n\r\n"


async def run(site: Site, rounds: int = 200) -> list[Figure]:
    if os.geteuid() != 0:
        print("bench.preview: skipped (sandbox users need root)", flush=True)
        return []
    from django.conf import settings

    from sandboxes.backends import forget_backends

    preview_port = _free_port()
    origin = f"http://{{port}}-{{session}}.localhost:{preview_port}"
    settings.CRAFT_SANDBOX_UIDS = "on"
    settings.CRAFT_SANDBOX_NETWORK = "isolated"
    settings.CRAFT_SANDBOX_LIMITS = "on"
    settings.CRAFT_PREVIEW_ORIGIN = origin
    forget_backends()
    env = {
        "CRAFT_SANDBOX_UIDS": "on",
        "CRAFT_SANDBOX_NETWORK": "isolated",
        "CRAFT_PREVIEW_ORIGIN": origin,
        "CRAFT_WARM_AGENTS": "0",
    }
    with site.serve("-e", f"tcp:port={preview_port}:interface=127.0.0.1", **env) as server:
        user, cookie = await asyncio.to_thread(site.user, f"preview-{uuid.uuid4().hex[:8]}")
        session_id = await asyncio.to_thread(site.session, user, "preview")
        client = await Client.open(server, cookie, session_id)
        await client.send({"type": "resume", "after": 0})
        said = await client.answer(f"serve {APP_PORT}")
        await client.close()
        if "I started a demo app" not in said:
            raise RuntimeError(f"the demo agent did not start its app: {said}")
        host = f"{APP_PORT}-{uuid.UUID(session_id).hex}.localhost:{preview_port}"
        preview_cookie = await asyncio.to_thread(_enter, server.url, cookie, session_id, host)
        alone, proxied = await asyncio.to_thread(
            _first_bytes, user, session_id, preview_port, host, preview_cookie, rounds
        )
    floor, through = median(alone), median(proxied)
    return [
        Figure("preview: first byte, the app alone", floor * 1000, "ms", "reported", None,
               f"GET / in the sandbox's network, median of {rounds}"),
        Figure("preview: first byte through the proxy", through * 1000, "ms",
               "within 10 ms of the app", through - floor <= 0.010,
               f"{(through - floor) * 1000:+.2f} ms; p90 {percentile(proxied, 90) * 1000:.2f} ms"),
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _enter(url: str, cookie: str, session_id: str, host: str) -> str:
    """Ask Craft for the preview's link and follow its entry; return the preview's cookie."""
    import http.client

    from tests.server import api_request

    status, given = api_request(
        url, cookie, "POST", f"/api/sessions/{session_id}/preview/", {"port": APP_PORT}
    )
    if status != 200:
        raise RuntimeError(f"no preview link: {status} {given}")
    parts = urllib.parse.urlsplit(given["url"])
    connection = http.client.HTTPConnection("127.0.0.1", int(host.rsplit(":", 1)[1]), timeout=30)
    connection.request("GET", f"{parts.path}?{parts.query}", headers={"Host": host})
    answer = connection.getresponse()
    answer.read()
    connection.close()
    found = re.match(r"([^=]+=[^;]+)", answer.getheader("Set-Cookie") or "")
    if answer.status != 303 or found is None:
        raise RuntimeError(f"the preview's entry answered {answer.status}")
    return found[1]


def _first_bytes(
    user: Any, session_id: str, preview_port: int, host: str, cookie: str, rounds: int
) -> tuple[list[float], list[float]]:
    """Return the seconds to the first byte of `GET /`: the app alone, through the proxy."""
    from sandboxes.backends import get_backend, network
    from sandboxes.models import Sandbox

    sandbox = Sandbox.objects.live().owned_by(user).get()
    first_uid = get_backend("local").pool.first  # type: ignore[attr-defined]
    direct = REQUEST.format(host=f"localhost:{APP_PORT}", cookie="").encode()
    proxied = REQUEST.format(host=host, cookie=f"Cookie: {cookie}\r\n").encode()
    alone, through = [], []
    for round_ in range(rounds + 10):  # the first ten warm both paths up
        inside = network.run_inside(first_uid, sandbox.pk, socket.socket)
        seconds = _time_first_byte(inside, ("127.0.0.1", APP_PORT), direct)
        if round_ >= 10:
            alone.append(seconds)
        seconds = _time_first_byte(socket.socket(), ("127.0.0.1", preview_port), proxied)
        if round_ >= 10:
            through.append(seconds)
    return alone, through


def _time_first_byte(connection: socket.socket, address: tuple[str, int], request: bytes) -> float:
    with connection:
        connection.settimeout(30)
        began = time.perf_counter()
        connection.connect(address)
        connection.sendall(request)
        first = connection.recv(1)
        seconds = time.perf_counter() - began
        if first != b"H":
            raise RuntimeError(f"no answer from {address}")
        while connection.recv(65536):
            pass
    return seconds


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=200)


if __name__ == "__main__":
    main()
