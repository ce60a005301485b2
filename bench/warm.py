"""Warm sandboxes: a brand-new user's first answer on Kubernetes, with and without warm pods.

The kubernetes backend runs against the project's test Kubernetes API server (tests/kubeapi:
the real client over loopback, exec running real processes) whose pods take 5 s to become
Ready (`ready_delay`). For each mode, daphne serves the site with that backend; a user who
has never had a sandbox opens a session over HTTP (`POST /api/sessions/`), opens its
websocket, resumes, and sends a prompt at once (it waits in the session's queue while the
sandbox starts). A run's time is from the POST until the first `agent_message_chunk` of the
answer arrives.

* warm off (CRAFT_K8S_WARM_SANDBOXES=0): the sandbox's volume claim and pod are created on
  the user's path, so the 5 s start is in the figure: the comparison;
* warm (CRAFT_K8S_WARM_SANDBOXES=2): before each run the bench waits (untimed) until the
  server's reaper thread has two warm pods Ready, each on a blank claim of its own; the
  user's sandbox claims one, and keeps its claim (relabelled for the owner: one more
  request on the path). Target 1 s.

The test server checks every object written against Kubernetes' schemas (some 15-20 ms
each on this machine, four of them on a warm claim's path), which a real API server does
far faster: the warm figure is, if anything, high (docs/history/performance-diary.md,
"Warm sandboxes (Kubernetes)").

Both modes run in one invocation, a fresh user per run, on one site (database).

    .venv/bin/python -m bench.warm [--runs 3]
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .harness import Figure, Server, Site, median, run_alone

READY_DELAY = 5.0
WARM = 2
TARGET_S = 1.0


@contextlib.contextmanager
def kubernetes_site(site: Site, warm: int, **extra: str) -> Iterator[tuple[Server, Any]]:
    """Serve the site on the kubernetes backend against a test API server of its own (with
    `extra` settings)."""
    from sandboxes.in_sandbox import workspace_tool
    from tests.kubeapi import KubeTestServer

    root = site.workdir / f"cluster-{warm}"
    with KubeTestServer(root=root) as kube:
        kube.ready_delay = READY_DELAY
        env = {
            "CRAFT_SANDBOX_BACKEND": "kubernetes",
            "CRAFT_K8S_KUBECONFIG": str(kube.write_kubeconfig(root / "kubeconfig")),
            "CRAFT_K8S_NAMESPACE": f"craft-bench-warm-{warm}",
            "CRAFT_K8S_WARM_SANDBOXES": str(warm),
            # The test server runs exec'd commands on this machine: the demo agent from here.
            "CRAFT_AGENT_COMMAND": f"{sys.executable} -m sandboxes.in_sandbox.demo_agent",
            "CRAFT_K8S_WORKSPACE_TOOL": f"{sys.executable} -I -S {workspace_tool.__file__}",
            **extra,
        }
        with site.serve(**env) as server:
            yield server, kube


def wait_for_warm_pods(count: int, timeout: float = 120) -> None:
    """Wait (untimed) until the server's reaper thread has `count` warm sandboxes ready."""
    from sandboxes.models import WarmSandbox

    deadline = time.monotonic() + timeout
    while WarmSandbox.objects.filter(status=WarmSandbox.Status.READY).count() < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {count} warm sandboxes after {timeout:g} s")
        time.sleep(0.1)


async def first_answer(server: Server, cookie: str) -> float:
    """Open a session as a new user and prompt it; return the seconds until the first chunk
    of the answer."""
    import aiohttp

    csrf = secrets.token_hex(16)  # a CSRF secret of the cookie's format: 32 characters
    headers = {"Cookie": f"{cookie}; csrftoken={csrf}", "Origin": server.url}
    async with aiohttp.ClientSession(headers=headers) as http:
        started = time.perf_counter()
        async with http.post(
            f"{server.url}/api/sessions/", json={}, headers={"X-CSRFToken": csrf}
        ) as response:
            if response.status != 201:
                raise RuntimeError(
                    f"POST /api/sessions/: {response.status} {await response.text()}"
                )
            session_id = (await response.json())["id"]
        ws_url = f"{server.url.replace('http', 'ws')}/ws/sessions/{session_id}/"
        async with http.ws_connect(ws_url, max_msg_size=0) as ws:
            await ws.send_str(json.dumps({"type": "resume", "after": 0}))
            prompt = {"type": "prompt", "id": uuid.uuid4().hex, "text": "hello"}
            await ws.send_str(json.dumps(prompt))
            while True:
                message = await ws.receive(timeout=120)
                if not isinstance(message.data, str):
                    raise RuntimeError(f"socket closed: {message}")
                frame = json.loads(message.data)
                if frame["type"] == "error":
                    raise RuntimeError(f"refused: {frame}")
                if frame.get("kind") == "agent_error":
                    raise RuntimeError(f"agent error: {frame}")
                if frame.get("kind") == "agent_message_chunk":
                    return time.perf_counter() - started


async def measure(site: Site, warm: int, runs: int) -> tuple[list[float], str]:
    """Return each run's first answer, and a detail: how many claimed a warm pod, and when
    (median) the sandbox was running after its row was made."""
    from sandboxes.models import Sandbox

    times = []
    running = []
    claimed = 0
    with kubernetes_site(site, warm) as (server, _kube):
        for run in range(runs):
            if warm:
                wait_for_warm_pods(warm)
            ready = {str(pk) for pk in warm_ids()}
            user, cookie = site.user(f"warm{warm}-{run}-{uuid.uuid4().hex[:6]}")
            times.append(await first_answer(server, cookie))
            sandbox = Sandbox.objects.get(owner=user)
            claimed += str(sandbox.pk) in ready
            running.append((sandbox.status_changed_at - sandbox.created_at).total_seconds())
    return times, (
        f"{claimed}/{runs} claimed a warm pod; sandbox running after {median(running):.2f} s"
    )


def warm_ids() -> list[Any]:
    from sandboxes.models import WarmSandbox

    return list(
        WarmSandbox.objects.filter(status=WarmSandbox.Status.READY).values_list("pk", flat=True)
    )


async def run(site: Site, runs: int = 3) -> list[Figure]:
    cold, cold_detail = await measure(site, 0, runs)
    hot, hot_detail = await measure(site, WARM, runs)
    name = f"new user, k8s {READY_DELAY:g} s pod start: first answer"
    spread = "runs " + ", ".join(f"{t:.2f}" for t in hot)
    return [
        Figure(
            f"{name} (warm {WARM})",
            median(hot),
            "s",
            f"<= {TARGET_S:g} s",
            median(hot) <= TARGET_S,
            f"median of {runs}; {spread}; {hot_detail}",
        ),
        Figure(
            f"{name} (warm off)",
            median(cold),
            "s",
            "comparison",
            None,
            f"median of {runs}; runs " + ", ".join(f"{t:.2f}" for t in cold) + f"; {cold_detail}",
        ),
    ]


if __name__ == "__main__":
    run_alone(__doc__.splitlines()[0], run, runs=3)
