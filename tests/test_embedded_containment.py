"""`make run` as root: agents run as sandbox users and cannot read the server's SQLite database.

The server is daphne in another process with the embedded defaults (SQLite under var/, the
default CRAFT_SANDBOX_UIDS=auto), started from a folder that other users can enter, as a
checkout on a server would be. A hostile agent probes the server's files; with sandbox users
off the same probes succeed, which shows they aim at the right files.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sandboxes.backends import containment

from .agents import agent_command
from .embedded import ROOT, SignedIn, chunks, embedded_env, manage, serve, turn
from .fake_dns import FakeDns
from .sandboxes.hostile import processes_of
from .server import Daphne

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox users need root")

SECRET = "embedded-secret-key-that-agents-must-not-see-0123456789"


def embedded(var: Path, uid_base: int, **extra: str) -> dict[str, str]:
    return embedded_env(
        var, CRAFT_SANDBOX_UID_BASE=str(uid_base), CRAFT_SANDBOX_UID_COUNT="1000", **extra
    )


@pytest.mark.parametrize(("uids", "outcome"), [("auto", {"denied", "missing"}), ("off", {"ok"})])
def test_a_hostile_agent_cannot_read_the_database_or_the_servers_environment(
    place, uid_base, uids, outcome
):
    python = containment.sandbox_python(uids=True)
    hostile = shlex.join(agent_command("hostile_agent", place / "agents", python))
    var = place / "var"
    env = embedded(
        var,
        uid_base,
        CRAFT_AGENT_COMMAND=hostile,
        CRAFT_SANDBOX_UIDS=uids,
        DJANGO_SECRET_KEY=SECRET,
    )
    with serve(env, var) as server:
        session = server.post_json("/api/sessions/", {"title": "attack"})
        ws = server.socket(session["id"])
        try:
            whoami = json.loads(chunks(turn(ws, "w", "whoami"))[0])
            environment = chunks(turn(ws, "e", "env"))[0]
            targets = [
                f"read:{var / 'craft.sqlite3'}",
                f"read:{var / 'admin-password.txt'}",
                f"list:{var}",
                f"read:/proc/{server.process.pid}/environ",
            ]
            probes = json.loads(chunks(turn(ws, "p", "probe " + " ".join(targets)))[0])
            # The server's own port (its HTTP API, its websockets) is one of the machine's.
            port = server.url.rsplit(":", 1)[1]
            reach = json.loads(chunks(turn(ws, "c", f"connect 127.0.0.1:{port}"))[0])
        finally:
            ws.close()
    assert reach == {f"127.0.0.1:{port}": "refused" if uids == "auto" else "ok"}
    assert (whoami["uid"] != 0) is (uids == "auto")
    assert SECRET not in environment
    # Denied by permissions, or not there at all in the agent's view (its jail).
    assert {target: result for target, result in probes.items() if result not in outcome} == {}
    assert set(probes) == set(targets)


def test_the_demo_agent_works_as_a_sandbox_user(place, uid_base):
    var = place / "var"
    with serve(embedded(var, uid_base), var) as server:
        session = server.post_json("/api/sessions/", {"title": "demo"})
        ws = server.socket(session["id"])
        try:
            ws.send(json.dumps({"type": "prompt", "id": "w", "text": "write hello.txt hi"}))
            while (frame := json.loads(ws.recv()))["kind"] != "permission_request":
                pass
            answer = {"type": "permission", "request": frame["data"]["request"], "option": "allow"}
            ws.send(json.dumps(answer))
            while json.loads(ws.recv())["kind"] != "turn_end":
                pass
            pids = [chunks(turn(ws, f"p{n}", "pid")) for n in (1, 2)]
        finally:
            ws.close()
    assert pids[0] == pids[1]
    written = var / "sandboxes" / session["sandbox"] / "sessions" / session["id"] / "hello.txt"
    assert written.read_text() == "hi"
    assert written.stat().st_uid >= 1_000_000_000
    assert (var / "craft.sqlite3").stat().st_mode & 0o077 == 0


def test_agents_and_whatever_they_started_die_with_the_server(place, uid_base):
    """A server killed outright (SIGKILL: no shutdown of its own) takes its agents with it,
    and the double-forked, setsid, SIGTERM-ignoring survivor of one of them too."""
    python = containment.sandbox_python(uids=True)
    hostile = shlex.join(agent_command("hostile_agent", place / "agents", python))
    var = place / "var"
    # No warm agent (CRAFT_WARM_AGENTS): the sandbox user's processes are exactly these two.
    embedded_env = embedded(var, uid_base, CRAFT_AGENT_COMMAND=hostile, CRAFT_WARM_AGENTS="0")
    with serve(embedded_env, var) as server:
        session = server.post_json("/api/sessions/", {"title": "survivor"})
        ws = server.socket(session["id"])
        try:
            uid = json.loads(chunks(turn(ws, "w", "whoami"))[0])["uid"]
            chunks(turn(ws, "s", "survivor"))
        finally:
            ws.close()
        assert len(processes_of(uid)) == 2  # the agent and its survivor
        server.process.kill()
        deadline = time.monotonic() + 30
        while processes_of(uid):
            assert time.monotonic() < deadline, f"processes of uid {uid} outlived the server"
            time.sleep(0.05)


def test_a_warm_agent_dies_with_the_server(place, uid_base):
    """The agent a sandbox keeps warm for its next session (CRAFT_WARM_AGENTS, 1 by default)
    goes with a server killed outright, as a session's agent does."""
    python = containment.sandbox_python(uids=True)
    hostile = shlex.join(agent_command("hostile_agent", place / "agents", python))
    var = place / "var"
    with serve(embedded(var, uid_base, CRAFT_AGENT_COMMAND=hostile), var) as server:
        session = server.post_json("/api/sessions/", {"title": "warm"})
        ws = server.socket(session["id"])
        try:
            uid = json.loads(chunks(turn(ws, "w", "whoami"))[0])["uid"]
        finally:
            ws.close()
        deadline = time.monotonic() + 30
        while len(processes_of(uid)) < 2:  # the session's agent, and the warm one after it
            assert time.monotonic() < deadline, "no agent was kept warm"
            time.sleep(0.05)
        server.process.kill()
        deadline = time.monotonic() + 30
        while processes_of(uid):
            assert time.monotonic() < deadline, f"processes of uid {uid} outlived the server"
            time.sleep(0.05)


def test_make_run_in_a_folder_other_users_cannot_enter_stops_and_no_agent_runs_as_root(uid_base):
    """A checkout under /root (0700 on Debian): `make run` once served it with every agent
    running as root, unjailed, network open. Now its first step stops, saying why and what to
    do; and a server started anyway (its checks skipped) refuses to start the sandbox."""
    place = Path(tempfile.mkdtemp(prefix="craft-private-"))  # 0700, as /root is
    try:
        var = place / "var"
        var.mkdir()
        python = containment.sandbox_python(uids=True)
        hostile = shlex.join(agent_command("hostile_agent", place / "agents", python))
        env = embedded(var, uid_base, CRAFT_AGENT_COMMAND=hostile)

        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert migrate.returncode != 0
        assert "sandboxes.E002" in migrate.stderr
        assert f"other users may not enter {place} (mode 700)" in migrate.stderr
        assert "CRAFT_SANDBOX_ROOT" in migrate.stderr

        manage(env, "migrate", "--noinput", "--skip-checks")
        output = manage(env, "ensure_admin", "--skip-checks")
        password = re.search(r"with password (\S+)", output).group(1)
        server = Daphne(var, base_env=env).start()
        try:
            assert server.process is not None
            signed_in = SignedIn(server.url, password, server.process)
            signed_in.post_json("/api/sessions/", {"title": "as root?"})
            deadline = time.monotonic() + 60
            while (sandbox := signed_in.get_json("/api/sandbox/"))["status"] == "provisioning":
                assert time.monotonic() < deadline, "the sandbox never settled"
                time.sleep(0.05)
        finally:
            server.terminate()
        assert sandbox["status"] == "failed"
        assert "sandbox users cannot reach the sandbox root" in sandbox["error"]
        assert not list((var / "sandboxes").glob("*-*-*-*-*"))  # no sandbox folder, no agent
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_names_resolve_in_a_sandbox_when_the_machines_name_server_is_on_loopback(place, uid_base):
    """systemd-resolved's 127.0.0.53, or dnsmasq's: on loopback, which in a sandbox's network
    is the sandbox's own. The server (here in a mount namespace of its own, whose resolv.conf
    names a name server on 127.0.0.77) has pasta forward the sandbox's queries to it, and the
    jail's resolv.conf names pasta's forwarding address."""
    resolv = place / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.77\noptions timeout:2 attempts:2\n")
    launcher = (
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv),
    )  # fmt: skip
    python = containment.sandbox_python(uids=True)
    hostile = shlex.join(agent_command("hostile_agent", place / "agents", python))
    var = place / "var"
    with (
        FakeDns("127.0.0.77", "198.51.100.7") as dns,
        serve(embedded(var, uid_base, CRAFT_AGENT_COMMAND=hostile), var, launcher) as server,
    ):
        session = server.post_json("/api/sessions/", {"title": "names"})
        ws = server.socket(session["id"])
        try:
            resolved = json.loads(chunks(turn(ws, "r", "resolve craft-test.example"))[0])
            shown = chunks(turn(ws, "c", "read /etc/resolv.conf"))[0]
        finally:
            ws.close()
    assert resolved == {"craft-test.example": "198.51.100.7"}
    assert "craft-test.example" in dns.asked
    assert "nameserver 192.0.2.53" in shown and "127.0.0.77" not in shown
