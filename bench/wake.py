"""Waking a sleeping sandbox on Kubernetes: from the prompt to the first word of the answer.

The kubernetes backend runs against the project's test Kubernetes API server (tests/kubeapi:
the real client over loopback, exec running real processes) whose pods take 5 s to become
Ready (`ready_delay`), as `bench.warm` does. Daphne serves the site with sandboxes that fall
asleep quickly (agents idle after 1 s, sandboxes after 2 s: CRAFT_SANDBOX_SLEEP_SECONDS).

Each run: a new user opens a session (`POST /api/sessions/`), opens its websocket, resumes,
and is answered once (untimed, the sandbox's first pod); the bench waits, untimed, until the
server's reaper has put the sandbox to sleep (its pod deleted, its volume kept); then, on the
same socket, it sends a prompt and times it until the answer's first `agent_message_chunk`:
the wake (a new pod on the same volume, 5 s), the agent's start with its session loaded, and
the answer. The floor is the pod's start; the target is the pod's start + 1 s.

    .venv/bin/python -m bench.wake [--runs 3]
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any

from .harness import Figure, Site, median, run_alone
from .warm import READY_DELAY, kubernetes_site

TARGET_S = READY_DELAY + 1.0
QUICK_SLEEP = {
    "CRAFT_AGENT_IDLE_SECONDS": "1",
    "CRAFT_REAPER_INTERVAL_SECONDS": "1",
    "CRAFT_SANDBOX_SLEEP_SECONDS": "2",
}


async def first_chunk(ws: Any, text: str) -> float:
    """Send a prompt on `ws`; return the seconds until its answer's first chunk."""
    started = time.perf_counter()
    await ws.send_str(json.dumps({"type": "prompt", "id": uuid.uuid4().hex, "text": text}))
    while True:
        message = await ws.receive(timeout=120)
        if not isinstance(message.data, str):
            raise RuntimeError(f"socket closed: {message}")
        frame = json.loads(message.data)
        if frame["type"] == "error" or frame.get("kind") == "agent_error":
            raise RuntimeError(f"refused: {frame}")
        if frame.get("kind") == "agent_message_chunk":
            return time.perf_counter() - started


async def until_turn_end(ws: Any) -> None:
    while json.loads((await ws.receive(timeout=120)).data).get("kind") != "turn_end":
        pass


def wait_until_asleep(user: Any, timeout: float = 120) -> None:
    from sandboxes.models import Sandbox

    deadline = time.monotonic() + timeout
    while not Sandbox.objects.filter(
        owner=user, status=Sandbox.Status.SLEEPING, status_detail=Sandbox.ASLEEP_IDLE
    ).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sandbox did not fall asleep within {timeout:g} s")
        time.sleep(0.1)


async def wake_once(server: Any, site: Site, name: str) -> float:
    import aiohttp

    user, cookie = site.user(name)
    csrf = secrets.token_hex(16)  # a CSRF secret of the cookie's format: 32 characters
    headers = {"Cookie": f"{cookie}; csrftoken={csrf}", "Origin": server.url}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(
            f"{server.url}/api/sessions/", json={}, headers={"X-CSRFToken": csrf}
        ) as response:
            if response.status != 201:
                raise RuntimeError(f"POST /api/sessions/: {response.status}")
            session_id = (await response.json())["id"]
        ws_url = f"{server.url.replace('http', 'ws')}/ws/sessions/{session_id}/"
        async with http.ws_connect(ws_url, max_msg_size=0) as ws:
            await ws.send_str(json.dumps({"type": "resume", "after": 0}))
            await first_chunk(ws, "remember pelican")
            await until_turn_end(ws)
            wait_until_asleep(user)
            return await first_chunk(ws, "recall")


async def run(site: Site, runs: int = 3) -> list[Figure]:
    times = []
    with kubernetes_site(site, 0, **QUICK_SLEEP) as (server, _kube):
        for index in range(runs):
            times.append(await wake_once(server, site, f"wake{index}-{uuid.uuid4().hex[:6]}"))
    spread = ", ".join(f"{t:.2f}" for t in times)
    return [
        Figure(
            f"k8s wake ({READY_DELAY:g} s pod start): prompt -> answer",
            median(times),
            "s",
            f"<= {TARGET_S:g} s (pod start {READY_DELAY:g} s + 1 s)",
            median(times) <= TARGET_S,
            f"median of {runs}; runs {spread}; floor: the pod's start, {READY_DELAY:g} s",
        )
    ]


if __name__ == "__main__":
    run_alone(__doc__.splitlines()[0], run, runs=3)
