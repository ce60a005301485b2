"""The hot path: follow-ups, streams, many sessions and cold starts, each against its floor.

Every figure is measured through daphne over real websockets, side by side in one run with the
same demo agent driven directly over its stdio (the floor):

* follow-up: a cached agent answers `count 1` (one chunk); prompt sent -> `turn_end` received,
  minus the same prompt sent to the agent directly. Samples are interleaved.
* new session with a warm agent: the first prompt of a fresh session whose sandbox keeps a
  warm agent (CRAFT_WARM_AGENTS=1: spawned and initialized before the session exists), sent
  as the page sends it: `start_agent` once the page is loaded (the agent takes the warm
  process, `session/new`, and the session's first checkpoint is taken in the background),
  then the prompt after a person's pause (PERSON_PAUSE, untimed); held to twice the cached
  follow-up sent after the same pause (a second of quiet makes the next prompt several
  times slower on this machine, the agent's own too: comparing it with back-to-back
  follow-ups would compare an idle machine with a busy one). Beside it, the same prompt
  sent without `start_agent` (it then pays `session/new` and the first checkpoint itself).
  Each sample waits (untimed) until the warm agent is there, and checks afterwards that the
  process that answered was that one.
* uncached / cached: the first prompt of a fresh session with warm agents off (spawn,
  initialize, session/new, prompt) over the cached follow-up; a server of its own
  (CRAFT_WARM_AGENTS=0), after the other one.
* stream: one turn of `count 10000`; the agent's own pipe rate over the rate at which the
  chunks arrive on the websocket.
* many sessions: 50 warm sessions each streaming `slow 40 0.05` (20 updates/s) at once; the p99
  of the gaps between a socket's consecutive chunks, and of prompt -> first agent chunk
  (the agent itself waits 50 ms before it).
* cold starts: 10 sessions stream `slow` while 20 fresh sessions send their first prompt at
  once; the p99 gap of the streaming sockets while the agents start, minus their p99 gap
  before. Beside it, the same storm with the agents driven directly (no Craft): what 20
  agent processes starting at once cost this machine's other agents by themselves.

    .venv/bin/python -m bench.hotpath [--rounds 30]
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .harness import (
    FOLLOW_UP,
    SLOW,
    SLOW_CHUNKS,
    Client,
    DirectAgent,
    Figure,
    Server,
    Site,
    follow,
    gaps_of,
    median,
    open_warm,
    percentile,
    run_alone,
    stream_summary,
    waiting_in,
)

STREAM_CHUNKS = 10_000
MANY = 50
COLD = 20
STREAMERS = 10
WARM_SETTLE = 0.5  # seconds from a warm agent's spawn until it is surely initialized
PERSON_PAUSE = 1.0  # seconds from the page's agent start to the first prompt (typing it)


async def follow_ups(server: Server, agent: DirectAgent, client: Client, rounds: int) -> dict:
    await client.prompt(FOLLOW_UP)  # the agent starts here; every later prompt reuses it
    floor, cached = [], []
    for _ in range(rounds):
        floor.append(agent.prompt(FOLLOW_UP)[0])
        cached.append(await client.prompt(FOLLOW_UP))
    return {"floor": median(floor), "cached": median(cached)}


async def paused_follow_ups(
    agent: DirectAgent, client: Client, rounds: int, pause: float = PERSON_PAUSE
) -> dict:
    """Cached follow-ups as a person sends them, and as the warm first prompt is sent: each
    after `pause` seconds of quiet, beside the floor after the same pause. On this machine a
    second of quiet makes the next prompt several times slower, Craft's and the agent's
    alike (idle cores, cold caches), so the warm first prompt is held to these."""
    floor, cached = [], []
    for _ in range(rounds):
        await asyncio.sleep(pause)
        floor.append(agent.prompt(FOLLOW_UP)[0])
        await asyncio.sleep(pause)
        cached.append(await client.prompt(FOLLOW_UP))
    return {"floor": median(floor), "cached": median(cached)}


async def uncached(
    server: Server, cookie: str, sessions: list[str], text: str = FOLLOW_UP
) -> float:
    times = []
    for session_id in sessions:
        client = await Client.open(server, cookie, session_id)
        await client.send({"type": "resume", "after": 0})
        times.append(await client.prompt(text))
        await client.close()
    return median(times)


async def warm_firsts(
    server: Server,
    cookie: str,
    home: Path,
    sessions: list[str],
    page: bool = True,
    text: str = FOLLOW_UP,
    settle: float = WARM_SETTLE,
) -> dict:
    """The first prompt (`text`) of each fresh session, each once its sandbox's warm agent
    waits (`settle` seconds after it appeared; with `page`, after `start_agent` and a
    person's pause, as the page sends it); return the median and how many were served by the
    warm agent."""
    times, served_warm = [], 0
    taken: set[int] = set()  # an agent taken keeps its folder: these are no longer warm
    for session_id in sessions:
        deadline = time.monotonic() + 30
        while not waiting_in(home) - taken:
            if time.monotonic() > deadline:
                raise RuntimeError("no warm agent appeared in the sandbox")
            await asyncio.sleep(0.05)
        # Its process is there before its `initialize` is answered: give it time to be.
        await asyncio.sleep(settle)
        taken |= waiting_in(home)
        client = await Client.open(server, cookie, session_id)
        await client.send({"type": "resume", "after": 0})
        if page:
            await client.send({"type": "start_agent"})
            while (await client.frame()).get("kind") != "available_commands_update":
                pass
            await asyncio.sleep(PERSON_PAUSE)
        times.append(await client.prompt(text))
        # A warm agent keeps working in the folder it started in: no process of the
        # sandbox's (the agent, or its jail) works in the session's workspace.
        served_warm += int(not waiting_in(home.parent / "sessions" / session_id))
        await client.close()
    return {"median": median(times), "warm": served_warm, "samples": len(times)}


async def stream(agent: DirectAgent, client: Client, rounds: int) -> dict:
    raw, craft = [], []
    for _ in range(rounds):
        seconds, updates = agent.prompt(f"count {STREAM_CHUNKS}")
        assert updates == STREAM_CHUNKS + 1, updates  # and the usage report at the turn's end
        raw.append(STREAM_CHUNKS / seconds)
        seconds, frames = await client.stream(f"count {STREAM_CHUNKS}")
        assert frames == STREAM_CHUNKS + 3, frames  # with the prompt, the usage and the end
        craft.append(STREAM_CHUNKS / seconds)
    return {"raw": median(raw), "craft": median(craft)}


async def many_sessions(server: Server, cookie: str, sessions: list[str]) -> dict:
    clients = await open_warm(server, cookie, sessions)
    results = await asyncio.gather(*(follow(c, SLOW) for c in clients))
    await asyncio.gather(*(c.close() for c in clients))
    return stream_summary(results, SLOW_CHUNKS)


async def cold_starts(server: Server, cookie: str, streamers: list[str], cold: list[str]) -> dict:
    clients = await open_warm(server, cookie, streamers)
    fresh = await asyncio.gather(*(Client.open(server, cookie, s) for s in cold))
    for client in fresh:
        await client.send({"type": "resume", "after": 0})
    streaming = [asyncio.ensure_future(follow(c, "slow 80 0.05")) for c in clients]
    await asyncio.sleep(1.5)
    storm_start = time.perf_counter()
    await asyncio.gather(*(c.prompt(FOLLOW_UP) for c in fresh))
    storm_end = time.perf_counter()
    results = await asyncio.gather(*streaming)
    await asyncio.gather(*(c.close() for c in [*clients, *fresh]))
    before = [g for a, _ in results for g in gaps_of(a, a[0] + 0.3, storm_start)]
    during = [g for a, _ in results for g in gaps_of(a, storm_start, storm_end + 0.1)]
    return {
        "before_p99": percentile(before, 99),
        "during_p99": percentile(during, 99),
        "storm_seconds": storm_end - storm_start,
        "errors": sum(len(e) for _, e in results),
    }


def direct_cold_starts(workdir: Path) -> dict:
    """The cold-start storm without Craft: the floor of `cold_starts` on this machine.

    10 agents driven directly stream `slow 80 0.05` while 20 more are started at once
    (spawn, initialize, session/new) and prompted; the same p99 gaps, before and during.
    """
    streamers = [DirectAgent(workdir / f"direct-stream-{i}") for i in range(STREAMERS)]
    arrivals: list[list[float]] = [[] for _ in streamers]

    def stream_one(agent: DirectAgent, times: list[float]) -> None:
        times.append(time.perf_counter())
        agent.prompt("slow 80 0.05", on_update=lambda: times.append(time.perf_counter()))

    def start_one(i: int) -> None:
        agent = DirectAgent(workdir / f"direct-cold-{i}")
        agent.prompt(FOLLOW_UP)
        agent.close()

    pairs = zip(streamers, arrivals, strict=True)
    threads = [threading.Thread(target=stream_one, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    storm_start = time.perf_counter()
    starters = [threading.Thread(target=start_one, args=(i,)) for i in range(COLD)]
    for thread in starters:
        thread.start()
    for thread in starters:
        thread.join()
    storm_end = time.perf_counter()
    for thread in threads:
        thread.join()
    for agent in streamers:
        agent.close()
    before = [g for a in arrivals for g in gaps_of(a, a[0] + 0.3, storm_start)]
    during = [g for a in arrivals for g in gaps_of(a, storm_start, storm_end + 0.1)]
    return {"before_p99": percentile(before, 99), "during_p99": percentile(during, 99)}


async def run(site: Site, rounds: int) -> list[Figure]:
    user, cookie = site.user(f"hot-{uuid.uuid4().hex[:6]}")
    follow_id = site.session(user)
    stream_id = site.session(user)
    fresh = [site.session(user) for _ in range(10)]
    warm_sessions = [site.session(user) for _ in range(10)]
    unstarted = [site.session(user) for _ in range(10)]
    home = site.home_of(user)
    many = [site.session(user) for _ in range(MANY)]
    streamers = [site.session(user) for _ in range(STREAMERS)]
    cold = [site.session(user) for _ in range(COLD)]
    agent = DirectAgent(site.workdir / "floor")
    try:
        with site.serve() as server:
            client = await Client.open(server, cookie, follow_id)
            await client.send({"type": "resume", "after": 0})
            fu = await follow_ups(server, agent, client, rounds)
            paused = await paused_follow_ups(agent, client, len(warm_sessions))
            await client.close()
            warm_first = await warm_firsts(server, cookie, home, warm_sessions)
            unstarted_first = await warm_firsts(server, cookie, home, unstarted, page=False)
            client = await Client.open(server, cookie, stream_id)
            await client.send({"type": "resume", "after": 0})
            await client.prompt(FOLLOW_UP)
            st = await stream(agent, client, 5)
            await client.close()
            ms = await many_sessions(server, cookie, many)
            cs = await cold_starts(server, cookie, streamers, cold)
        with site.serve(CRAFT_WARM_AGENTS="0") as server:
            cold_first = await uncached(server, cookie, fresh)
        floor_cs = await asyncio.to_thread(direct_cold_starts, site.workdir)
    finally:
        agent.close()
    overhead = (fu["cached"] - fu["floor"]) * 1000
    warm_ms = warm_first["median"] * 1000
    warm_limit = 2 * paused["cached"] * 1000
    ratio = cold_first / fu["cached"]
    slow_down = st["raw"] / st["craft"]
    added = (cs["during_p99"] - cs["before_p99"]) * 1000
    added_floor = (floor_cs["during_p99"] - floor_cs["before_p99"]) * 1000
    pg = site.database == "postgresql"
    limit = 8.0 if pg else 5.0
    return [
        Figure(
            "cached follow-up minus floor",
            overhead,
            "ms",
            f"<= {limit:g} ms",
            overhead <= limit,
            f"cached {fu['cached'] * 1000:.2f} ms, floor {fu['floor'] * 1000:.2f} ms",
        ),
        Figure(
            "new session, first prompt, warm agent",
            warm_ms,
            "ms",
            f"<= 2x paused cached ({warm_limit:.1f} ms)",
            warm_ms <= warm_limit and warm_first["warm"] == warm_first["samples"],
            f"{warm_first['warm']}/{warm_first['samples']} served by the warm agent, "
            f"after start_agent; cached after the same {PERSON_PAUSE:g} s pause "
            f"{paused['cached'] * 1000:.2f} ms (floor {paused['floor'] * 1000:.2f} ms), "
            f"back to back {fu['cached'] * 1000:.2f} ms; warm off {cold_first * 1000:.1f} ms",
        ),
        Figure(
            "the same, no start_agent (the prompt starts the agent)",
            unstarted_first["median"] * 1000,
            "ms",
            "-",
            None,
            f"{unstarted_first['warm']}/{unstarted_first['samples']} served by the warm agent",
        ),
        Figure(
            "uncached / cached",
            ratio,
            "x",
            ">= 8",
            ratio >= 8,
            f"uncached {cold_first * 1000:.1f} ms (CRAFT_WARM_AGENTS=0)",
        ),
        Figure(
            "10k-chunk stream: pipe rate / websocket rate",
            slow_down,
            "x",
            "<= 4 and >= 25,000 ev/s",
            slow_down <= 4 and st["craft"] >= 25_000,
            f"websocket {st['craft']:,.0f} ev/s, pipe {st['raw']:,.0f} ev/s",
        ),
        Figure(
            f"{MANY} sessions x 20 updates/s: gap p99",
            ms["gap_p99"] * 1000,
            "ms",
            "<= 100 ms",
            ms["gap_p99"] <= 0.1 and ms["errors"] == 0,
            f"errors {ms['errors']}",
        ),
        Figure(
            f"{MANY} sessions x 20 updates/s: first chunk p99",
            ms["first_p99"] * 1000,
            "ms",
            "<= 300 ms",
            ms["first_p99"] <= 0.3,
            "includes the agent's own 50 ms delay",
        ),
        Figure(
            f"{COLD} cold starts: added gap p99",
            added,
            "ms",
            "<= 50 ms",
            added <= 50,
            f"gap p99 {cs['before_p99'] * 1000:.0f} -> {cs['during_p99'] * 1000:.0f} ms, "
            f"starts took {cs['storm_seconds'] * 1000:.0f} ms, errors {cs['errors']}; "
            f"without Craft the same storm adds {added_floor:.0f} ms",
        ),
    ]


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=30)


if __name__ == "__main__":
    main()
