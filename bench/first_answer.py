"""A new session's first answer as an API client sees it, beside a follow-up and the agent alone.

A client from outside, through daphne, in a sandbox that is running and keeps a warm agent
(CRAFT_WARM_AGENTS=1, the default), does what a script driving the API does, in rounds:

* first answer: QUIET seconds after its last answer, it creates a session
  (`POST /api/sessions/`), opens its websocket and resumes it, waits `pause` (0.2 s, then 2 s
  in a second series), and prompts the demo agent (`count 1`); prompt sent -> `turn_end`
  received. No `start_agent`: the client does not know the page's ways. Each sample waits
  (untimed) for the sandbox's warm agent first, and counts whether that agent answered.
* follow-up: in the same session, QUIET seconds after that answer and the same `pause`,
  the same prompt; what the first answer is held to (at most twice it): an idle machine
  wakes up slowly, so each is compared with a prompt after the same quiet.
* the agent alone: after the same quiet and pause, the demo agent spawned directly (no
  Craft, no jail), `initialize`, `session/new` and the same prompt, timed from the spawn.

Both series run with sandbox users on (the production configuration; as root) and off,
each on a daphne of its own; medians of `rounds` rounds.

    .venv/bin/python -m bench.first_answer [--rounds 7]
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from .harness import (
    FOLLOW_UP,
    AsyncDirectAgent,
    Client,
    Figure,
    Site,
    median,
    run_alone,
    waiting_in,
)
from .scale import create_session

QUIET = 3.0  # seconds from the client's last answer to its next request
PAUSES = (0.2, 2.0)  # seconds from the socket's opening to the first prompt


async def _warm_agent(home: Path, taken: set[int]) -> None:
    """Wait (untimed) until a warm agent not taken yet waits in the sandbox's home; if one
    had to be waited for, give it QUIET seconds too (its start is not the client's)."""
    if waiting_in(home) - taken:
        return
    deadline = time.monotonic() + 30
    while not waiting_in(home) - taken:
        if time.monotonic() > deadline:
            raise RuntimeError("no warm agent appeared in the sandbox")
        await asyncio.sleep(0.05)
    await asyncio.sleep(QUIET)


async def _timed(client: Client) -> float:
    return await client.prompt(FOLLOW_UP)


async def _direct(workdir: Path) -> float:
    """Return the seconds from the demo agent's spawn to its first answer (no Craft)."""
    started = time.perf_counter()
    agent = await AsyncDirectAgent.start(workdir / f"alone-{uuid.uuid4().hex[:8]}")
    _, errors = await agent.follow(FOLLOW_UP)
    took = time.perf_counter() - started
    await agent.close()
    if errors:
        raise RuntimeError(f"the agent alone failed: {errors}")
    return took


async def _series(site: Site, uids: str, rounds: int) -> dict[float, dict[str, Any]]:
    """Measure both pauses on a daphne of its own, sandbox users `uids` ("on" or "off")."""
    from django.conf import settings

    from sandboxes.backends import forget_backends
    from sandboxes.services import provision_sandbox

    settings.CRAFT_SANDBOX_UIDS = uids
    forget_backends()
    user, cookie = await asyncio.to_thread(site.user, f"first-{uids}-{uuid.uuid4().hex[:6]}")
    await asyncio.to_thread(provision_sandbox, user)
    home = await asyncio.to_thread(site.home_of, user)
    results: dict[float, dict[str, Any]] = {
        p: {"first": [], "follow": [], "alone": [], "warm": 0} for p in PAUSES
    }
    taken: set[int] = set()  # an agent taken keeps its folder: these are no longer warm
    with site.serve(CRAFT_SANDBOX_UIDS=uids, CRAFT_WARM_AGENTS="1") as server:
        # One untimed session first: the server's own first session (imports, caches).
        client = await Client.open(server, cookie, await create_session(server, cookie))
        await client.send({"type": "resume", "after": 0})
        await _timed(client)
        await client.close()
        for _ in range(rounds):
            for pause in PAUSES:
                got = results[pause]
                await asyncio.sleep(QUIET)
                await _warm_agent(home, taken)
                taken |= waiting_in(home)
                session_id = await create_session(server, cookie)
                client = await Client.open(server, cookie, session_id)
                await client.send({"type": "resume", "after": 0})
                await asyncio.sleep(pause)
                got["first"].append(await _timed(client))
                workspace = home.parent / "sessions" / session_id
                got["warm"] += int(not waiting_in(workspace))
                await asyncio.sleep(QUIET + pause)
                got["follow"].append(await _timed(client))
                await client.close()
                await asyncio.sleep(QUIET + pause)
                got["alone"].append(await _direct(site.workdir))
    return results


async def run(site: Site, rounds: int = 7) -> list[Figure]:
    configurations = ["on", "off"] if os.geteuid() == 0 else ["off"]
    if len(configurations) == 1:
        print("bench.first_answer: not root: sandbox users off only", flush=True)
    from django.conf import settings

    from sandboxes.backends import forget_backends

    saved = settings.CRAFT_SANDBOX_UIDS
    figures = []
    try:
        measured = {uids: await _series(site, uids, rounds) for uids in configurations}
    finally:
        settings.CRAFT_SANDBOX_UIDS = saved
        forget_backends()
    for uids, results in measured.items():
        for pause, got in results.items():
            first, follow = median(got["first"]) * 1000, median(got["follow"]) * 1000
            alone = median(got["alone"]) * 1000
            ratio = first / follow
            figures.append(
                Figure(
                    f"first answer, {pause:g} s after opening, uids {uids}",
                    first,
                    "ms",
                    f"<= 2x follow-up ({2 * follow:.1f} ms)",
                    ratio <= 2 and got["warm"] == len(got["first"]),
                    f"{ratio:.1f}x the follow-up after the same pause ({follow:.2f} ms); "
                    f"the agent alone (spawn to answer) {alone:.1f} ms; "
                    f"{got['warm']}/{len(got['first'])} served by the warm agent",
                )
            )
    return figures


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=7)


if __name__ == "__main__":
    main()
