"""Resume: how long a websocket `resume` of N stored events takes, through daphne.

N events are stored in one session before the server starts; a signed-in client sends
`resume` after 0 and times until the last event arrives, checking that every seq arrives
once, in order.

    .venv/bin/python -m bench.resume [--events 10000] [--runs 5]
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .harness import Client, Figure, Server, Site, median, run_alone

TARGET_MS = 250.0


def store(site: Site, events: int) -> tuple[str, str]:
    from craft.storage.eventlog import append_events

    user, cookie = site.user(f"resume-{uuid.uuid4().hex[:6]}")
    session_id = site.session(user)
    chunk = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "a typical streamed chunk of agent text "},
    }
    for start in range(0, events, 1000):
        append_events(session_id, [("agent_message_chunk", chunk)] * min(1000, events - start))
    return cookie, session_id


async def time_resume(server: Server, cookie: str, session_id: str, events: int) -> float:
    client = await Client.open(server, cookie, session_id)
    try:
        assert client.hello["last_seq"] == events, client.hello
        started = time.perf_counter()
        await client.send({"type": "resume", "after": 0})
        for expected in range(1, events + 1):
            frame = await client.frame()
            assert frame["type"] == "event" and frame["seq"] == expected, frame
        return time.perf_counter() - started
    finally:
        await client.close()


async def run(site: Site, events: int = 10_000, runs: int = 5) -> list[Figure]:
    cookie, session_id = store(site, events)
    with site.serve() as server:
        times = [await time_resume(server, cookie, session_id, events) for _ in range(runs)]
    ms = median(times) * 1000
    return [
        Figure(
            f"resume of {events:,} stored events",
            ms,
            "ms",
            f"<= {TARGET_MS:g} ms",
            ms <= TARGET_MS if events == 10_000 else None,
            f"best {min(times) * 1000:.0f} ms, worst {max(times) * 1000:.0f} ms",
        )
    ]


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, events=10_000, runs=5)


if __name__ == "__main__":
    main()
