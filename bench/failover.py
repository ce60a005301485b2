"""Several workers: how long a session takes to fail over, and what forwarding costs.

Two daphne workers share PostgreSQL (BENCH_DATABASE_URL, else the local server's `postgres`
database as the place to create a throwaway one) and Redis (BENCH_REDIS_URL, default
redis://127.0.0.1:6379/2):

* failover: a session's owner is SIGKILLed right after a turn; the time from the kill to the
  first event of the next prompt, sent through the other worker (which takes the session
  over and starts a new agent). The owner is started again for the next round.
* forwarding: a follow-up (`count 1`) sent through the worker that runs the agent, and one
  sent through the other worker (forwarded to the owner over a direct link, events pushed
  back on it: craft.cluster.peers), each with only its own socket open, as a person's one
  tab; the difference of the medians is what forwarding costs. Beside it, the same with a
  socket open on each worker at once (two tabs: each follow-up's events reach both).

    .venv/bin/python -m bench.failover [--rounds 10]
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from typing import Any

from .harness import Client, Figure, Site, median, run_alone

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/2")
FORWARD_TARGET_MS = 2.0  # what a forwarded follow-up may add to a direct one
# The workers meet through Redis (the site's own servers use the in-memory channel layer).
CLUSTER = {"REDIS_URL": REDIS_URL, "CRAFT_SESSION_LEASE_SECONDS": "15"}


async def first_event(client: Client, text: str) -> float:
    """Send a prompt; return when its first event (the stored prompt) arrives."""
    prompt_id = uuid.uuid4().hex
    await client.send({"type": "prompt", "id": prompt_id, "text": text})
    while True:
        frame = await client.frame()
        if frame.get("type") == "error":
            raise RuntimeError(f"refused: {frame}")
        if frame.get("kind") == "user_message" and frame["data"]["id"] == prompt_id:
            arrived = time.perf_counter()
            break
    while (await client.frame()).get("kind") != "turn_end":
        pass
    return arrived


async def open_client(server: Any, cookie: str, session_id: str) -> Client:
    client = await Client.open(server, cookie, session_id)
    await client.send({"type": "resume", "after": client.hello["last_seq"]})
    return client


async def failover(site: Site, cookie: str, session_id: str, rounds: int) -> list[float]:
    """Kill the owner, prompt through the survivor, which becomes the next round's owner."""
    times = []
    with contextlib.ExitStack() as servers:
        owner = servers.enter_context(site.serve(**CLUSTER))
        owner_client = await open_client(owner, cookie, session_id)
        await owner_client.prompt("pid")  # the first owner starts the agent
        for _ in range(rounds):
            survivor = servers.enter_context(site.serve(**CLUSTER))
            survivor_client = await open_client(survivor, cookie, session_id)
            owner.process.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            owner.process.wait(10)
            await owner_client.close()
            times.append(await first_event(survivor_client, "pid") - killed)
            owner, owner_client = survivor, survivor_client
        await owner_client.close()
    return times


async def forwarding(
    site: Site, cookie: str, session_id: str, rounds: int
) -> tuple[float, float, float, float]:
    """Medians of the follow-up through the owner and through the other worker: one socket
    open at a time (a person's one tab, on either worker; alternating, three follow-ups per
    socket), then both open at once (two tabs, one on each worker)."""
    with site.serve(**CLUSTER) as owner, site.serve(**CLUSTER) as other:
        first = await open_client(owner, cookie, session_id)
        await first.prompt("count 1")  # the first worker owns the session from here on
        await first.close()
        direct: list[float] = []
        forwarded: list[float] = []
        while len(forwarded) < rounds:
            for server, samples in ((owner, direct), (other, forwarded)):
                client = await open_client(server, cookie, session_id)
                for _ in range(3):
                    samples.append(await client.prompt("count 1"))
                await client.close()
        local = await open_client(owner, cookie, session_id)
        remote = await open_client(other, cookie, session_id)
        both_direct, both_forwarded = [], []
        for _ in range(rounds):
            both_direct.append(await local.prompt("count 1"))
            both_forwarded.append(await remote.prompt("count 1"))
        await local.close()
        await remote.close()
    return median(direct), median(forwarded), median(both_direct), median(both_forwarded)


async def run(site: Site, rounds: int = 10) -> list[Figure]:
    if site.database != "postgresql":
        return [Figure("failover (needs PostgreSQL)", float("nan"), "", "-", None,
                       "set BENCH_DATABASE_URL")]  # fmt: skip
    user, cookie = site.user(f"failover-{uuid.uuid4().hex[:6]}")
    kill_session = site.session(user)
    forward_session = site.session(user)
    times = await failover(site, cookie, kill_session, rounds)
    direct, forwarded, both_direct, both_forwarded = await forwarding(
        site, cookie, forward_session, max(rounds * 9, 90)
    )
    overhead = (forwarded - direct) * 1000
    return [
        Figure(
            "failover: owner SIGKILLed -> next prompt's first event",
            median(times) * 1000,
            "ms",
            "-",
            None,
            f"same host (the dead process is noticed at once); best {min(times) * 1000:.0f}, "
            f"worst {max(times) * 1000:.0f} ms over {len(times)} rounds",
        ),
        Figure(
            "forwarded follow-up minus direct",
            overhead,
            "ms",
            f"<= {FORWARD_TARGET_MS:g} ms",
            overhead <= FORWARD_TARGET_MS,
            f"direct {direct * 1000:.2f} ms, through the other worker {forwarded * 1000:.2f} ms;"
            f" with a socket on each worker: {both_direct * 1000:.2f} and"
            f" {both_forwarded * 1000:.2f} ms",
        ),
    ]


def main(argv: Any = None) -> None:
    if "BENCH_DATABASE_URL" not in os.environ:
        os.environ["BENCH_DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/postgres"
    run_alone(__doc__.splitlines()[0], run, argv, rounds=10)


if __name__ == "__main__":
    main()
