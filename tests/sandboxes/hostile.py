"""Helpers for tests that attack the local backend with tests/agents/hostile_agent.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandboxes import services
from sandboxes.backends import forget_backends
from tests.ready import open_ready_session

from .agents import run_turn

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox users need root")


def contain(settings, uids: str) -> None:
    settings.CRAFT_SANDBOX_UIDS = uids
    forget_backends()


def open_agent(user):
    """Open a session for `user` and start its (hostile) agent; return (session, connection)."""
    session = open_ready_session(user, "containment")
    connection = services.connect_agent(session.sandbox, session.pk)
    return session, connection


def ask(connection, text: str):
    """Run a turn and return the JSON of its first chunk."""
    items = run_turn(connection, text)
    return json.loads(items[0].data["content"]["text"])


def processes_of(uid: int, *, network: bool = False) -> list[int]:
    """Return the pids (as this machine sees them) of the live processes running as `uid`:
    the sandbox's agents and what they started, and with `network` also its network's pasta
    (which runs as the sandbox's uid, outside any agent's jail)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] in ("Z", "X") or int(fields["Uid"].split()[0]) != uid:
            continue
        if network or not fields["Name"].strip().startswith(("pasta", "passt")):
            found.append(int(entry.name))
    return found


def host_pid(whoami: dict) -> int:
    """Return the agent's process id as this machine sees it (a jailed agent sees its own PID
    namespace): its uid's process, as long as it is the only one of that uid."""
    if whoami["uid"] == os.getuid():
        return whoami["pid"]
    [pid] = processes_of(whoami["uid"])
    return pid
