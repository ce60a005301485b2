"""The local backend keeps agents away from the server's secrets and from other sandboxes.

The attacks are real: a hostile ACP agent (tests/agents/hostile_agent.py) prints its
environment and tries to read, list, write and signal what is not its own. Every probe that
must be denied with sandbox users on is shown to succeed with them off, so none of these
tests can pass by probing the wrong thing.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from craft import services as craft_services
from sandboxes import services
from sandboxes.backends import SandboxError, containment, get_backend
from tests.ready import open_ready_session

from ..agents import run_turn
from ..hostile import ask, contain, host_pid, needs_root, open_agent

SERVER_SECRETS = {
    "DJANGO_SECRET_KEY": "server-secret-key-0123456789",
    "DATABASE_URL": os.environ["DATABASE_URL"],
    "REDIS_URL": "redis://:redis-password@127.0.0.1:6379/0",
    "UNLISTED_API_TOKEN": "not-for-agents",
}


# --- the environment ------------------------------------------------------------------------


@pytest.mark.parametrize("uids", ["off", pytest.param("on", marks=needs_root)])
def test_an_agent_gets_a_minimal_environment_and_never_the_servers_secrets(
    settings, machine, monkeypatch, owner, uids
):
    contain(settings, uids)
    for name, value in SERVER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PROVIDER_API_KEY", "sk-passed-on-purpose")
    settings.CRAFT_AGENT_ENV = {"PROVIDER_API_KEY": None, "AGENT_MODE": "careful"}
    session, connection = open_agent(owner)
    items = run_turn(connection, "env")
    dump = items[0].data["content"]["text"]
    env = json.loads(dump)

    for secret in SERVER_SECRETS.values():
        assert secret not in dump
    sandbox = Path(session.sandbox.reference)
    assert env["HOME"] == str(sandbox / "home")
    assert env["TMPDIR"] == str(sandbox / "tmp")
    assert env["PATH"].split(":")[0] == str(machine / "var" / "sandboxes" / ".craft" / "bin")
    assert env["PROVIDER_API_KEY"] == "sk-passed-on-purpose"
    assert env["AGENT_MODE"] == "careful"
    allowed = {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ"}
    allowed |= {"TERM", "PROVIDER_API_KEY", "AGENT_MODE", "PWD"}
    assert {name for name in env if not name.startswith("LC_")} <= allowed


def test_agent_env_names_the_server_keeps_are_refused_at_start():
    from ...test_settings import load_settings

    for entry, message in [
        ("DATABASE_URL", "must not pass DATABASE_URL"),
        ("OK_KEY,DJANGO_SECRET_KEY", "must not pass DJANGO_SECRET_KEY"),
        ("REDIS_URL_FILE", "must not pass REDIS_URL_FILE"),
        ("HOME=/root", "cannot set HOME"),
        ("1BAD", "'1BAD' is not a variable name"),
    ]:
        result = load_settings(DJANGO_DEBUG="1", CRAFT_AGENT_ENV=entry)
        assert result.returncode != 0
        assert f"CRAFT_AGENT_ENV {message}" in result.stderr or message in result.stderr


# --- sandbox users --------------------------------------------------------------------------


@needs_root
def test_each_sandbox_runs_as_a_user_of_its_own_that_owns_its_folder(
    settings, machine, owner, stranger
):
    contain(settings, "on")
    mine, my_agent = open_agent(owner)
    theirs, their_agent = open_agent(stranger)
    me, them = ask(my_agent, "whoami"), ask(their_agent, "whoami")

    assert me["uid"] != them["uid"]
    for who, session in ((me, mine), (them, theirs)):
        assert who["uid"] >= settings.CRAFT_SANDBOX_UID_BASE
        assert (who["uid"], who["gid"], who["groups"]) == (who["uid"], who["uid"], [])
        folder = Path(session.sandbox.reference)
        for path in (
            folder,
            folder / "home",
            folder / "tmp",
            folder / "sessions" / str(session.pk),
        ):
            info = path.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (who["uid"], 0o700), path
    root = Path(settings.CRAFT_SANDBOX_ROOT)
    assert stat.S_IMODE(root.stat().st_mode) == 0o711
    assert stat.S_IMODE(Path(settings.VAR_DIR).stat().st_mode) == 0o711


@pytest.mark.parametrize(
    ("uids", "outcome"),
    [("off", {"ok"}), pytest.param("on", {"denied", "missing"}, marks=needs_root)],
)
def test_an_agent_cannot_reach_another_sandbox_or_the_server(
    settings, machine, owner, stranger, uids, outcome
):
    contain(settings, uids)
    mine, my_agent = open_agent(owner)
    victim_pid = host_pid(ask(my_agent, "whoami"))
    victim = Path(mine.sandbox.reference)
    workspace = victim / "sessions" / str(mine.pk)
    (workspace / "notes.txt").write_text("the owner's work")
    (Path(settings.VAR_DIR) / "server-only.txt").write_text("server data")
    _, attacker = open_agent(stranger)

    attacks = [
        f"list:{victim}",
        f"list:{workspace}",
        f"read:{workspace / 'notes.txt'}",
        f"write:{workspace / 'planted.txt'}",
        f"list:{settings.CRAFT_SANDBOX_ROOT}",
        f"list:{settings.VAR_DIR}",
        f"read:/proc/{os.getpid()}/environ",
        f"kill:{os.getpid()}",
        f"kill:{victim_pid}",
    ]
    own = attacker.cwd
    controls = [f"write:{own}/mine.txt", f"read:{own}/mine.txt", f"list:{own}"]
    results = ask(attacker, "probe " + " ".join(attacks + controls))

    # Denied by permissions, or not there at all in the agent's view (its jail).
    assert {target: results[target] for target in attacks if results[target] not in outcome} == {}
    assert [results[target] for target in controls] == ["ok", "ok", "ok"]
    assert (workspace / "planted.txt").exists() is (outcome == {"ok"})
    assert my_agent.is_running


@needs_root
def test_the_demo_agent_runs_as_the_sandbox_user_and_its_files_are_its_own(
    settings, machine, owner
):
    contain(settings, "on")
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent"]
    session, connection = open_agent(owner)
    items = run_turn(connection, "write notes/todo.txt buy milk", answer="allow")
    assert items[-1].stop_reason == "end_turn"
    written = Path(session.sandbox.reference) / "sessions" / str(session.pk) / "notes" / "todo.txt"
    assert written.read_text() == "buy milk"
    owner_uid = Path(session.sandbox.reference).stat().st_uid
    assert written.stat().st_uid == owner_uid != 0
    assert stat.S_IMODE(written.stat().st_mode) == 0o600  # the agent's umask is 077


@needs_root
def test_a_sandbox_from_before_sandbox_users_is_adopted(settings, machine, owner):
    contain(settings, "off")
    session = open_ready_session(owner, "older")
    folder = Path(session.sandbox.reference)
    workspace = folder / "sessions" / str(session.pk)
    workspace.mkdir(parents=True)  # as earlier versions made it, at the session's opening
    (workspace / "old.txt").write_text("from before")
    folder.chmod(0o755)  # as earlier versions made it
    assert folder.stat().st_uid == 0

    contain(settings, "on")
    connection = services.connect_agent(session.sandbox, session.pk)
    uid = ask(connection, "whoami")["uid"]
    assert uid >= settings.CRAFT_SANDBOX_UID_BASE
    assert {p.stat().st_uid for p in [folder, *folder.rglob("*")]} == {uid}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@needs_root
def test_an_agent_command_sandbox_users_cannot_run_is_refused_clearly(settings, machine, owner):
    contain(settings, "on")
    private = machine / "private"
    private.mkdir(mode=0o700)
    program = private / "agent"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    settings.CRAFT_AGENT_COMMAND = [str(program)]
    session = open_ready_session(owner, "unrunnable")
    with pytest.raises(SandboxError, match="cannot be run by sandbox users"):
        get_backend().start_agent(session.sandbox, session.pk)


@needs_root
@pytest.mark.parametrize("swapped", ["home", "sessions"])
def test_a_folder_an_agent_swapped_for_a_link_does_not_turn_the_servers_work_elsewhere(
    settings, machine, owner, swapped
):
    contain(settings, "on")
    session, agent = open_agent(owner)
    elsewhere = machine / "elsewhere"  # root's, as /etc would be
    (elsewhere / str(session.pk)).mkdir(parents=True)
    elsewhere.chmod(0o755)
    before = sorted(p.name for p in elsewhere.iterdir()), elsewhere.stat()
    link = Path(session.sandbox.reference) / swapped
    assert run_turn(agent, f"link {link} {elsewhere}")[0].data["content"]["text"] == "linked"

    # What the server does in a sandbox's folder: new workspaces, agent starts, removals.
    with pytest.raises((SandboxError, craft_services.SessionError), match="not a folder"):
        second = open_ready_session(owner, "second")
        services.connect_agent(second.sandbox, second.pk)
    services.remove_session_workspace(session.sandbox, session.pk)

    after = sorted(p.name for p in elsewhere.iterdir()), elsewhere.stat()
    assert after[0] == before[0]
    assert (after[1].st_uid, after[1].st_mode) == (before[1].st_uid, before[1].st_mode)


def test_the_installed_demo_agent_runs_from_paths_with_spaces(tmp_path):
    odd = tmp_path / "a folder with spaces"
    odd.mkdir()
    (odd / "python3").symlink_to(sys.executable)
    wrapper = containment.install_demo_agent(odd / "bin", str(odd / "python3"))
    result = subprocess.run([wrapper, "--version"], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "craft-demo-agent 1.2.0", result.stderr


@pytest.mark.parametrize("module", ["demo_agent", "workspace_tool"])
@pytest.mark.parametrize("python", [sys.executable, containment.sandbox_python(uids=True)])
def test_the_installed_tools_start_from_bytecode_their_python_can_use(tmp_path, module, python):
    """A script is compiled at every start (tens of milliseconds for these, at each agent's
    start and each listing); an imported module's bytecode is read from `__pycache__` when
    its header matches the source's time and size. The install writes it for the python that
    runs the tools (the server's, or the system's when sandboxes have users)."""
    tools = tmp_path / "bin"
    containment.install_demo_agent(tools, python)
    containment.install_workspace_tool(tools, python)
    source = tools / f"{module}.py"
    (cached,) = (tools / "__pycache__").glob(f"{module}.*.pyc")
    assert stat.S_IMODE(cached.stat().st_mode) == 0o644
    assert stat.S_IMODE(cached.parent.stat().st_mode) == 0o755

    def first_words() -> str:
        code = f"import sys; sys.path.append({str(tools)!r}); import {module} as m; "
        code += "print(m.__doc__[:5])"
        run = subprocess.run(
            [python, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30
        )
        return run.stdout.strip()

    first = first_words()
    # Another text of the same size and time: only bytecode that was used still says `first`.
    text = source.read_bytes()
    info = source.stat()
    source.write_bytes(b'"""XXXXX' + text[8:])
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert first_words() == first != "XXXXX"
    cached.unlink()
    assert first_words() == "XXXXX"

    # The source changed (another version of Craft): installed again, with its bytecode.
    containment.install_demo_agent(tools, python)
    containment.install_workspace_tool(tools, python)
    assert source.read_bytes() == text
    info = source.stat()
    source.write_bytes(b'"""XXXXX' + text[8:])
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert first_words() == first


def test_the_workspace_tool_runs_as_a_module_with_its_arguments(tmp_path):
    tools = tmp_path / "bin"
    containment.install_workspace_tool(tools, sys.executable)
    (tmp_path / "sandbox" / "sessions" / "s" / "a folder").mkdir(parents=True)
    command = containment.module_command(sys.executable, tools, "workspace_tool")
    result = subprocess.run(
        [*command, str(tmp_path / "sandbox"), "sessions/s", "list", "", "0", "10"],
        capture_output=True, timeout=30, check=True,
    )  # fmt: skip
    listing = json.loads(result.stdout)
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [("a folder", "folder")]


# --- when sandbox users cannot be had -------------------------------------------------------


def test_auto_turns_sandbox_users_off_without_root_and_says_why_once(
    settings, machine, monkeypatch, caplog
):
    settings.CRAFT_SANDBOX_UIDS = "auto"
    monkeypatch.setattr(containment.os, "geteuid", lambda: 1000)
    containment._explained.clear()
    first, second = (
        containment.sandbox_uids_enabled(machine),
        containment.sandbox_uids_enabled(machine),
    )
    assert (first, second) == (False, False)
    warnings = [r.message for r in caplog.records if "Sandbox users are off" in r.message]
    assert len(warnings) == 1
    assert "runs as uid 1000, not root" in warnings[0]


def test_on_without_root_stops_with_a_clear_error(settings, machine, monkeypatch):
    settings.CRAFT_SANDBOX_UIDS = "on"
    monkeypatch.setattr(containment.os, "geteuid", lambda: 1000)
    with pytest.raises(ImproperlyConfigured, match="CRAFT_SANDBOX_UIDS=on, but the server runs"):
        containment.sandbox_uids_enabled(machine)


@needs_root
@pytest.mark.parametrize("uids", ["auto", "on"])
def test_as_root_a_sandbox_root_others_cannot_enter_refuses_sandboxes_never_runs_agents_as_root(
    settings, machine, owner, uids
):
    """A checkout under /root (0700 on Debian) once ran every agent as root, unjailed: now
    sandboxes refuse to start, saying why and what to do, and no agent process starts."""
    contain(settings, uids)
    machine.chmod(0o700)  # a parent of the sandbox root that other users cannot enter
    assert containment.sandbox_uids_enabled(settings.CRAFT_SANDBOX_ROOT)
    problem = containment.sandbox_root_problem(settings.CRAFT_SANDBOX_ROOT)
    assert f"other users may not enter {machine} (mode 700)" in problem
    assert "CRAFT_SANDBOX_ROOT" in problem

    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == sandbox.Status.FAILED
    assert "sandbox users cannot reach the sandbox root" in sandbox.error
    with pytest.raises(SandboxError, match="sandbox users cannot reach the sandbox root"):
        get_backend().start_agent(sandbox, uuid.uuid4())
    assert not (settings.CRAFT_SANDBOX_ROOT / str(sandbox.pk)).exists()

    machine.chmod(0o755)  # the operator's fix, then a new backend (a restart)
    contain(settings, uids)
    session = open_ready_session(owner, "fixed")
    whoami = ask(services.connect_agent(session.sandbox, session.pk), "whoami")
    assert whoami["uid"] >= settings.CRAFT_SANDBOX_UID_BASE


@needs_root
def test_manage_py_stops_as_root_when_sandbox_users_cannot_reach_the_sandbox_root(
    settings, machine
):
    from sandboxes.checks import sandbox_users

    contain(settings, "auto")
    assert sandbox_users() == []
    machine.chmod(0o700)
    (error,) = sandbox_users()
    assert error.id == "sandboxes.E002"
    assert f"{machine} (mode 700)" in error.msg
    contain(settings, "off")  # said in so many words: agents run as root, and nothing stops
    assert sandbox_users() == []


def test_manage_py_stops_when_sandbox_users_are_on_but_impossible(settings, machine, monkeypatch):
    from sandboxes.checks import sandbox_users

    settings.CRAFT_SANDBOX_UIDS = "on"
    assert (sandbox_users() == []) is (os.geteuid() == 0)
    monkeypatch.setattr(containment.os, "geteuid", lambda: 1000)
    (error,) = sandbox_users()
    assert error.id == "sandboxes.E001"
    assert "the server runs as uid 1000" in error.msg
    settings.CRAFT_SANDBOX_UIDS = "auto"
    assert sandbox_users() == []


def test_the_workspace_tool_runs_at_a_lower_priority_than_the_server():
    """Listings and checkpoints are background work next to the live sessions: a burst of
    them must leave the server's event loop the CPU (docs/history/performance-diary.md,
    "The latest run, and the workspace": cold starts since checkpoints)."""
    from sandboxes.backends.local import TOOL_NICENESS, LocalToolProcess

    tool = LocalToolProcess([sys.executable, "-c", "import os; print(os.nice(0))"])
    assert int(tool.readline(100)) == os.nice(0) + TOOL_NICENESS
    assert tool.finish(timeout=30) == 0


@needs_root
def test_each_contained_agent_gets_its_owners_key_and_cannot_read_anothers(
    settings, machine, owner, stranger
):
    from craft import credentials

    contain(settings, "on")
    key = "PROVIDER_API_KEY"
    settings.CRAFT_AGENTS = [
        {
            "id": "keyed",
            "title": "Keyed",
            "command": list(settings.CRAFT_AGENT_COMMAND),  # the hostile agent
            "env": {},
            "credentials": [{"name": key, "label": "Provider API key", "help": ""}],
        }
    ]
    values = {owner.pk: "sk-olivia-contained-0123456789", stranger.pk: "sk-sam-contained-987654"}
    agents = {}
    for user in (owner, stranger):
        credentials.store_credential(user, key, values[user.pk])
        session = open_ready_session(user, "keyed")
        launch = credentials.launch_of(session)
        agents[user.pk] = services.connect_agent(session.sandbox, session.pk, launch=launch)

    mine, theirs = agents[owner.pk], agents[stranger.pk]
    assert ask(mine, "env")[key] == values[owner.pk]
    assert values[owner.pk] not in json.dumps(ask(theirs, "env"))
    # The other sandbox's agent cannot read the owner's agent's environment (another user,
    # and not even in its view of the machine's processes).
    pid = host_pid(ask(mine, "whoami"))
    environ = f"read:/proc/{pid}/environ"
    assert ask(theirs, f"probe {environ}")[environ] != "ok"
    assert values[owner.pk].encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
