"""Idle websockets: the memory each open, idle session socket costs daphne, and how many it holds.

A signed-in client opens N sockets on one session (each gets its `hello` and sends `resume`,
as the page does), waits, checks that every socket is still open, and reads daphne's resident
memory before and after.

    .venv/bin/python -m bench.idle [--sockets 10000]
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from .harness import Figure, Site, raise_open_files_limit, run_alone

TARGET_KIB = 50.0


async def run(site: Site, sockets: int = 10_000) -> list[Figure]:
    import aiohttp

    raise_open_files_limit()
    user, cookie = site.user(f"idle-{uuid.uuid4().hex[:6]}")
    session_id = site.session(user)
    with site.serve() as server:
        url = f"{server.url.replace('http', 'ws')}/ws/sessions/{session_id}/"
        connector = aiohttp.TCPConnector(limit=0)
        http = aiohttp.ClientSession(
            connector=connector, headers={"Cookie": cookie, "Origin": server.url}
        )
        opened: list[Any] = []
        gate = asyncio.Semaphore(64)

        async def open_one() -> None:
            async with gate:
                ws = await http.ws_connect(url, autoping=True, heartbeat=None)
                hello = json.loads((await ws.receive()).data)
                assert hello["type"] == "hello"
                await ws.send_str(json.dumps({"type": "resume", "after": 0}))
                opened.append(ws)

        # Warm the server up (imports, first connections) before the baseline.
        await asyncio.gather(*(open_one() for _ in range(20)))
        await asyncio.sleep(1)
        before = server.rss_kib()
        started = time.perf_counter()
        await asyncio.gather(*(open_one() for _ in range(sockets)))
        opening = time.perf_counter() - started
        await asyncio.sleep(5)
        after = server.rss_kib()
        held = sum(1 for ws in opened[20:] if not ws.closed)
        for ws in opened:
            await ws.close()
        await http.close()
    per_socket = (after - before) / sockets
    return [
        Figure(
            "idle websocket memory",
            per_socket,
            "KiB/socket",
            f"<= {TARGET_KIB:g} KiB",
            per_socket <= TARGET_KIB and held == sockets,
            f"{held:,} of {sockets:,} held; opened in {opening:.1f} s; "
            f"RSS {before / 1024:.0f} -> {after / 1024:.0f} MiB",
        )
    ]


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, sockets=10_000)


if __name__ == "__main__":
    main()
