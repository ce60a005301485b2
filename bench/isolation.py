"""What keeping a sandbox apart costs: the jail, the sandbox's own network and its cgroup, per
sandbox start, per agent start and per turn, each beside the same without them.

Run as root (the layers need it), in this process, on the local backend, with a small ACP
agent (tests/agents/hostile_agent.py, run by the system's python3, as a sandbox user can). Four
configurations, each a new user with a sandbox of its own, measured in one run:

* none: sandbox users off (`CRAFT_SANDBOX_UIDS=off`): the agent runs as the server's user, in
  this machine's network, with no budget: the floor;
* jail: sandbox users and the jail, this machine's network (`CRAFT_SANDBOX_NETWORK=open`), no
  budget (`CRAFT_SANDBOX_LIMITS=off`);
* + network: the sandbox's own network (`isolated`: a namespace and its pasta, the rule);
* + cgroup: and the sandbox's budget: what `make run` as root has.

For each: the sandbox's provisioning (its folder, uid, network namespace and pasta, cgroups);
an agent's start (spawned, `initialize` and `session/new` answered) and stop; a turn that does
nothing but answer; and a turn that opens one TCP connection to an endpoint of this machine's
loopback that sandboxes are allowed (through pasta's forwarding, in a sandbox's network).
Medians of several rounds.

    .venv/bin/python -m bench.isolation [--rounds 15]
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import threading
import time
import uuid
from typing import Any

from .harness import Figure, Site, median, run_alone

CONFIGURATIONS = {
    "none": {"CRAFT_SANDBOX_UIDS": "off"},
    "jail": {
        "CRAFT_SANDBOX_UIDS": "on",
        "CRAFT_SANDBOX_NETWORK": "open",
        "CRAFT_SANDBOX_LIMITS": "off",
    },
    "+ network": {
        "CRAFT_SANDBOX_UIDS": "on",
        "CRAFT_SANDBOX_NETWORK": "isolated",
        "CRAFT_SANDBOX_LIMITS": "off",
    },
    "+ cgroup": {
        "CRAFT_SANDBOX_UIDS": "on",
        "CRAFT_SANDBOX_NETWORK": "isolated",
        "CRAFT_SANDBOX_LIMITS": "on",
    },
}


async def run(site: Site, rounds: int = 15) -> list[Figure]:
    if os.geteuid() != 0:
        print("bench.isolation: skipped (the jail, networks and cgroups need root)", flush=True)
        return []
    return await asyncio.to_thread(_run, site, rounds)


def _run(site: Site, rounds: int) -> list[Figure]:
    from django.conf import settings

    from sandboxes.backends import containment, firewall, forget_backends
    from tests.agents import agent_command

    python = containment.sandbox_python(uids=True)
    kept = (*CONFIGURATIONS["+ cgroup"], "CRAFT_AGENT_COMMAND", "CRAFT_SANDBOX_ALLOW")
    saved = {name: getattr(settings, name) for name in kept}
    settings.CRAFT_AGENT_COMMAND = agent_command("hostile_agent", site.workdir / "agents", python)
    results: dict[str, dict[str, float]] = {}
    with listening() as port:
        settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), port)]
        try:
            for name, values in CONFIGURATIONS.items():
                for setting, value in values.items():
                    setattr(settings, setting, value)
                # The rule that an earlier server of this run (isolated) left in place: gone
                # for the configurations without it, put back by the backend for the others.
                firewall.remove(settings.CRAFT_SANDBOX_UID_BASE)
                forget_backends()
                results[name] = _measure(site, name, rounds, port)
        finally:
            for setting, value in saved.items():
                setattr(settings, setting, value)
            forget_backends()
    return _figures(results)


def _measure(site: Site, name: str, rounds: int, port: int) -> dict[str, float]:
    from craft.services import open_session
    from sandboxes import services
    from sandboxes.models import Sandbox
    from tests.sandboxes.agents import run_turn

    provisions, starts, turns, connects = [], [], [], []
    for _ in range(3):  # a sandbox of its own each time: its network and cgroups made anew
        user, _ = site.user(f"isolation-{uuid.uuid4().hex[:8]}")
        began = time.perf_counter()
        sandbox = services.provision_sandbox(user)
        provisions.append(time.perf_counter() - began)
        if sandbox.status != Sandbox.Status.RUNNING:
            raise RuntimeError(f"{name}: the sandbox did not start: {sandbox.error}")
        session = open_session(user, name)
        for _ in range(max(1, rounds // 3)):
            began = time.perf_counter()
            connection = services.connect_agent(sandbox, session.pk)
            starts.append(time.perf_counter() - began)
            run_turn(connection, "whoami")  # untimed: the first turn warms the agent up
            for _ in range(3):
                began = time.perf_counter()
                run_turn(connection, "whoami")
                turns.append(time.perf_counter() - began)
                began = time.perf_counter()
                items = run_turn(connection, f"connect 127.0.0.1:{port}")
                connects.append(time.perf_counter() - began)
                reply = items[0].data["content"]["text"]
                if '"ok"' not in reply:
                    raise RuntimeError(f"{name}: the allowed endpoint was not reached: {reply}")
            services.stop_all_agents()
        services.terminate_sandbox(sandbox)
    return {
        "sandbox start": median(provisions) * 1000,
        "agent start": median(starts) * 1000,
        "turn": median(turns) * 1000,
        "turn with a connection": median(connects) * 1000,
    }


def _figures(results: dict[str, dict[str, float]]) -> list[Figure]:
    figures = []
    floor = results["none"]
    for what in ("sandbox start", "agent start", "turn", "turn with a connection"):
        for name, measured in results.items():
            added = measured[what] - floor[what]
            detail = "the floor" if name == "none" else f"{added:+.2f} ms on no isolation"
            label = f"isolation: {what}, {name}"
            figures.append(Figure(label, measured[what], "ms", "reported", None, detail))
    return figures


class listening:
    """A TCP server on a free port of 127.0.0.1 that accepts and closes, on a thread."""

    def __enter__(self) -> int:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()
        return self.sock.getsockname()[1]

    def _serve(self) -> None:
        while not self.stopped:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            connection.close()

    def __exit__(self, *exc: Any) -> None:
        self.stopped = True
        self.sock.close()


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=15)


if __name__ == "__main__":
    main()
