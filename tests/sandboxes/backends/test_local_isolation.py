"""Nothing of a local sandbox reaches the machine's services or outlives the sandbox.

The attacks are real: the hostile agent (tests/agents/hostile_agent.py), running as a sandbox
user in its jail, connects to the machine's PostgreSQL, Redis and other listeners over TCP and
Unix sockets, leaves a double-forked, setsid, SIGTERM-ignoring survivor behind, and forks as
much as it can. Each attack is also shown to succeed where the guard is off, so no test passes
by probing the wrong thing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from craft import session_activity
from sandboxes import reaper, services
from sandboxes.agent.connections import agent_connections
from sandboxes.backends import SandboxError, firewall, forget_backends, jail, network
from sandboxes.models import Sandbox
from tests.ready import open_ready_session

from ...agents import AGENTS
from ..agents import run_turn
from ..hostile import ask, contain, needs_root, open_agent, processes_of

pytestmark = [needs_root, pytest.mark.django_db(transaction=True)]


@contextlib.contextmanager
def listening(family: int = socket.AF_INET, host: str = "127.0.0.1"):
    """Listen on a free TCP port of `host`; yield the port."""
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def outbound_address() -> str | None:
    """Return this machine's own non-loopback address (the one it would use to go out)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def name_server() -> str | None:
    """Return the first name server of resolv.conf that is not on loopback, if any."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        words = line.split()
        if (
            len(words) >= 2
            and words[0] == "nameserver"
            and not ipaddress.ip_address(words[1].split("%")[0]).is_loopback
        ):
            return words[1]
    return None


def wait_until(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


POSTGRES_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")


@pytest.mark.parametrize(
    ("uids", "network", "blocked"),
    [
        ("off", "isolated", set()),  # no sandbox users: nothing is isolated (the control)
        ("on", "open", {"unix"}),  # the jail still hides the sockets
        ("on", "isolated", {"unix", "tcp"}),
    ],
)
def test_an_agent_cannot_reach_the_machines_own_services(
    settings, machine, owner, uids, network, blocked
):
    contain(settings, uids)
    settings.CRAFT_SANDBOX_NETWORK = network
    with (
        listening() as server_port,
        listening() as allowed_port,
        listening(socket.AF_INET6, "::1") as v6_port,
        listening(socket.AF_INET, "0.0.0.0") as any_port,
        socket.socket(socket.AF_UNIX) as unix,
    ):
        # Outside /tmp (which the jail replaces whole), where a service's socket would be.
        unix_path = Path("/run") / f"craft-test-{machine.name}.sock"
        unix.bind(str(unix_path))
        unix_path.chmod(0o777)
        unix.listen(4)
        settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), allowed_port)]
        tcp = ["127.0.0.1:5432", "127.0.0.1:6379", f"127.0.0.1:{server_port}", f"[::1]:{v6_port}"]
        if (address := outbound_address()) is not None:
            tcp.append(f"{address}:{any_port}")
        sockets = [f"unix:{unix_path}"]
        if POSTGRES_SOCKET.exists():
            sockets.append(f"unix:{POSTGRES_SOCKET}")
        reachable = [f"127.0.0.1:{allowed_port}"]
        if (server := name_server()) is not None:
            reachable.append(f"dns:{server}")  # the way out still works
        try:
            _, agent = open_agent(owner)
            results = ask(agent, "connect " + " ".join(tcp + sockets + reachable))
        finally:
            unix_path.unlink()

    refused = "refused"
    expected = {target: refused if "tcp" in blocked else "ok" for target in tcp}
    # Not even there: /run (where both are) is the jail's own.
    expected |= {target: "error: ENOENT" if "unix" in blocked else "ok" for target in sockets}
    expected |= dict.fromkeys(reachable, "ok")
    assert results == expected


@pytest.mark.parametrize("network", ["isolated", "open"])
def test_an_agent_reaches_the_servers_it_starts_on_its_own_loopback(
    settings, machine, owner, network
):
    """A dev server, a test database, opencode's own API: an agent serves on 127.0.0.1 and
    ::1 and connects to itself, while the machine's PostgreSQL, Redis and a server of its
    loopback stay out of reach (the rule once refused both alike)."""
    contain(settings, "on")
    settings.CRAFT_SANDBOX_NETWORK = network
    with listening() as server_port:
        _, agent = open_agent(owner)
        own = ask(agent, "selfserve")
        machine_services = ["127.0.0.1:5432", "127.0.0.1:6379", f"127.0.0.1:{server_port}"]
        theirs = ask(agent, "connect " + " ".join(machine_services))
    assert own == {"127.0.0.1": "ok", "::1": "ok"}
    reached = "refused" if network == "isolated" else "ok"
    assert theirs == dict.fromkeys(machine_services, reached)


def test_sandboxes_share_no_sockets_and_see_none_of_the_machines(
    settings, machine, owner, stranger
):
    """An abstract socket, a socket file bound after the other's agent started, and
    /proc/net: one sandbox's are not another's, nor the machine's. Control: without the jail
    both sockets are reached and /proc/net lists the machine's PostgreSQL."""
    contain(settings, "on")
    _check_sockets_between_sandboxes(machine, owner, stranger, isolated=True)


def test_without_the_jail_sockets_are_shared(settings, machine, owner, stranger):
    contain(settings, "off")
    _check_sockets_between_sandboxes(machine, owner, stranger, isolated=False)


def _check_sockets_between_sandboxes(machine, owner, stranger, isolated: bool) -> None:
    victim_session, victim = open_agent(owner)
    _, attacker = open_agent(stranger)  # started before the victim binds anything
    name = f"craft-test-{machine.name}"
    socket_file = Path(victim_session.sandbox.reference) / "home" / "agent.sock"
    targets = [f"abstract:{name}", f"unix:{socket_file}"]
    assert ask(victim, "listen " + " ".join(targets)) == dict.fromkeys(targets, "listening")
    results = ask(attacker, "connect " + " ".join(targets))
    postgres_port = ":1538 "  # 5432, as /proc/net/tcp writes it
    listed = ask_text(attacker, "read /proc/net/tcp")
    unix = ask_text(attacker, "read /proc/net/unix")
    if isolated:
        assert results == {targets[0]: "refused", targets[1]: "error: ENOENT"}
        assert postgres_port not in listed and name not in unix
    else:
        assert results == dict.fromkeys(targets, "ok")
        assert postgres_port in listed and name in unix


def ask_text(connection, text: str) -> str:
    """Run a turn and return the text of its first chunk."""
    return run_turn(connection, text)[0].data["content"]["text"]


def test_an_agent_installed_under_tmp_runs_with_its_whole_installation(settings, machine, owner):
    """npm's layout under /tmp, which the jail replaces with its own: the command is a link
    in `node_modules/.bin` to a package that loads another package beside it. Binding back
    only the command's file (as the jail once did) fails it, as Claude Code failed with
    ERR_MODULE_NOT_FOUND."""
    contain(settings, "on")
    install = Path(tempfile.mkdtemp(prefix="craft-npm-"))
    try:
        install.chmod(0o755)
        modules = install / "node_modules"
        (modules / "agent-core").mkdir(parents=True)
        (modules / "the-agent" / "bin").mkdir(parents=True)
        (modules / ".bin").mkdir()
        shutil.copyfile(AGENTS / "hostile_agent.py", modules / "agent-core" / "hostile_agent.py")
        launcher = modules / "the-agent" / "bin" / "agent"
        launcher.write_text(
            "#!/usr/bin/python3\n"
            "import os, runpy\n"
            "here = os.path.dirname(os.path.realpath(__file__))\n"
            "core = os.path.join(here, '..', '..', 'agent-core', 'hostile_agent.py')\n"
            "runpy.run_path(core, run_name='__main__')\n"
        )
        for folder in [install, *(p for p in modules.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)
        for file in modules.rglob("*"):
            if file.is_file():
                file.chmod(0o755)
        (modules / ".bin" / "the-agent").symlink_to("../the-agent/bin/agent")
        settings.CRAFT_AGENT_COMMAND = [str(modules / ".bin" / "the-agent")]
        _, agent = open_agent(owner)
        assert ask(agent, "whoami")["uid"] >= settings.CRAFT_SANDBOX_UID_BASE
        assert jail.install_folders(modules / ".bin" / "the-agent") == [modules]
    finally:
        shutil.rmtree(install, ignore_errors=True)


def test_an_installation_is_found_by_its_layout():
    """What the jail binds back of an agent installed under /tmp, which it replaces."""
    folder = Path(tempfile.mkdtemp(prefix="craft-install-"))
    try:
        python = folder / "python3.13" / "bin" / "python3.13"  # a copied prefix: bin and lib
        python.parent.mkdir(parents=True)
        python.write_text("")
        venv = folder / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text(f"home = {python.parent}\n")
        (venv / "bin" / "python").symlink_to(python)
        script = venv / "bin" / "fast-agent"
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n")
        assert jail.install_folders(script) == [venv, folder / "python3.13"]
        nested = folder / "node_modules" / "x" / "node_modules" / "y" / "z.js"
        nested.parent.mkdir(parents=True)
        nested.write_text("")
        assert jail.install_folders(nested) == [folder / "node_modules"]
        loose = folder / "agent"
        loose.write_text("#!/usr/bin/env node\n")
        assert jail.install_folders(loose) == [folder]
    finally:
        shutil.rmtree(folder)
    assert jail.install_folders(Path("/usr/bin/python3")) == []  # the jail shows it


def test_user_namespaces_are_refused_in_the_jail(settings, machine, owner):
    """`unshare -Urn` would hand the agent every capability over namespaces of its own: the
    kernel surface most escalations go through. Control: without the jail it works."""
    for uids, refused in (("on", True), ("off", False)):
        contain(settings, uids)
        _, agent = open_agent(owner)
        for argv in (["unshare", "-Urn", "true"], ["unshare", "-U", "true"]):
            done = ask(agent, "exec " + " ".join(argv))
            assert (done["code"] != 0) is refused, (uids, argv, done)
            if refused:
                assert "Operation not permitted" in done["stderr"]
        agent_connections.stop_all()


def test_the_network_rule_is_one_table_for_the_uid_range_with_the_allowed_endpoints(
    settings, machine, owner
):
    contain(settings, "on")
    settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("::1"), 8080)]
    open_ready_session(owner)
    base = settings.CRAFT_SANDBOX_UID_BASE
    listing = subprocess.run(
        [firewall.NFT, "list", "table", "inet", firewall.table_name(base)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"meta skuid {base}-{base + 999} jump sandbox" in listing
    assert "::1 . tcp . 8080" in listing and "::1 . udp . 8080" in listing


def test_the_reaper_puts_back_a_network_rule_someone_removed(settings, machine, owner):
    contain(settings, "on")
    open_ready_session(owner)
    base = settings.CRAFT_SANDBOX_UID_BASE
    firewall.remove(base)
    assert not firewall.is_installed(base)
    reaper.reap_sandboxes(session_activity)
    assert firewall.is_installed(base)


def test_the_reaper_starts_a_sandbox_network_whose_pasta_died_again(settings, machine, owner):
    """pasta is the sandbox's one way out: killed, the sandbox's agents keep their loopback
    and lose the rest until the reaper's next pass starts it again, in the same namespace."""
    contain(settings, "on")
    with listening() as allowed_port:
        settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), allowed_port)]
        _, agent = open_agent(owner)
        target = f"127.0.0.1:{allowed_port}"
        assert ask(agent, f"connect {target}") == {target: "ok"}
        uid = ask(agent, "whoami")["uid"]
        [pasta] = set(processes_of(uid, network=True)) - set(processes_of(uid))
        os.kill(pasta, 9)
        wait_until(lambda: pasta not in processes_of(uid, network=True), "pasta is dead")
        assert ask(agent, f"connect {target}") == {target: "refused"}
        reaper.reap_sandboxes(session_activity)
        assert ask(agent, f"connect {target}") == {target: "ok"}  # the same agent, back out
        assert ask(agent, "selfserve") == {"127.0.0.1": "ok", "::1": "ok"}


def test_the_reaper_removes_the_network_of_a_sandbox_that_is_gone(settings, machine, owner):
    contain(settings, "on")
    sandbox = services.provision_sandbox(owner)
    base = settings.CRAFT_SANDBOX_UID_BASE
    uid = Path(sandbox.reference).stat().st_uid
    assert network.sandbox_ids(base) == [sandbox.pk]
    assert processes_of(uid, network=True)  # its pasta
    with connection.cursor() as cursor:  # the row only, no terminate: as a restored backup
        cursor.execute(f"DELETE FROM {Sandbox._meta.db_table} WHERE id = %s", [sandbox.pk])
    reaper.reap_sandboxes(session_activity)
    assert network.sandbox_ids(base) == []
    wait_until(lambda: not processes_of(uid, network=True), "the network's pasta is left")


def test_sandboxes_refuse_to_start_without_their_isolation(settings, machine, owner, monkeypatch):
    contain(settings, "on")
    bwrap = jail.BWRAP
    monkeypatch.setattr(firewall, "NFT", None)
    refused = services.provision_sandbox(owner)
    assert refused.status == Sandbox.Status.FAILED
    assert "needs nftables" in refused.error
    settings.CRAFT_SANDBOX_NETWORK = "open"  # the operator's explicit choice
    forget_backends()
    assert services.provision_sandbox(owner).status == Sandbox.Status.RUNNING

    monkeypatch.setattr(jail, "BWRAP", None)
    forget_backends()
    with pytest.raises(SandboxError, match="need bubblewrap installed"):
        services.connect_agent(Sandbox.objects.get(owner=owner), uuid.uuid4())

    monkeypatch.setattr(jail, "BWRAP", bwrap)
    monkeypatch.setattr(network, "PASTA", None)
    settings.CRAFT_SANDBOX_NETWORK = "isolated"
    forget_backends()
    with pytest.raises(SandboxError, match=r"need passt installed .*apt-get install passt"):
        services.connect_agent(Sandbox.objects.get(owner=owner), uuid.uuid4())


# --- nothing outlives its agent or its sandbox ------------------------------------------------


@pytest.mark.parametrize("ending", ["agent stopped", "sandbox terminated"])
def test_a_double_forked_survivor_ends_with_its_agent_and_its_sandbox(
    settings, machine, owner, ending
):
    contain(settings, "on")
    session, agent = open_agent(owner)
    uid = ask(agent, "whoami")["uid"]
    ask(agent, "survivor")
    assert len(processes_of(uid)) == 2  # the agent and its survivor
    if ending == "agent stopped":
        agent_connections.stop_session(session.sandbox_id, session.pk)
    else:
        services.terminate_sandbox(session.sandbox)
        wait_until(lambda: not processes_of(uid, network=True), "its network outlived it")
    wait_until(lambda: not processes_of(uid), f"processes of uid {uid} are left")


def test_without_the_jail_the_survivor_outlives_its_agent(settings, machine, owner):
    """The control: what the jail prevents does happen without it."""
    contain(settings, "off")
    session, agent = open_agent(owner)
    survivor = int(ask(agent, "survivor"))
    agent_connections.stop_session(session.sandbox_id, session.pk)
    try:
        os.kill(survivor, 0)  # still there
    finally:
        os.kill(survivor, 9)


def test_a_uid_is_never_handed_out_while_a_process_still_runs_as_it(
    settings, machine, owner, stranger, staff
):
    contain(settings, "on")
    first = services.provision_sandbox(owner)
    uid = Path(first.reference).stat().st_uid
    leftover = run_as(uid, "sleep", "300")  # a process the sandbox left (from before the jail)
    # setpriv switches to the uid after it starts: until then there is nothing to kill.
    wait_until(lambda: leftover.pid in processes_of(uid), "the leftover runs as the uid")
    services.terminate_sandbox(first)
    wait_until(lambda: leftover.poll() is not None, "terminate leaves the sandbox's processes")

    again = run_as(uid, "sleep", "300")  # one that terminate could not reach
    wait_until(lambda: again.pid in processes_of(uid), "the second leftover runs as the uid")
    try:
        second = services.provision_sandbox(stranger)
        assert Path(second.reference).stat().st_uid != uid
    finally:
        again.kill()
        again.wait()
    third = services.provision_sandbox(staff)
    assert Path(third.reference).stat().st_uid == uid  # free again once nothing runs as it


def run_as(uid: int, *argv: str) -> subprocess.Popen:
    setpriv = [jail.SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return subprocess.Popen([*setpriv, *argv])


# --- what else the jail keeps --------------------------------------------------------------


@pytest.mark.parametrize(("limit", "started"), [(30, range(1, 30)), (0, range(100, 101))])
def test_a_sandbox_runs_at_most_craft_sandbox_pids_processes(
    settings, machine, owner, limit, started
):
    contain(settings, "on")
    settings.CRAFT_SANDBOX_PIDS = limit
    _, agent = open_agent(owner)
    assert int(ask(agent, "spawn 100")) in started
    assert ask(agent, "whoami")["uid"]  # the agent itself goes on


def test_an_agent_writes_only_in_its_sandbox_and_a_tmp_of_its_own(settings, machine, owner):
    # World-writable, like /tmp, and outside it (and /run, which the jail replaces too):
    # anyone could leave files here.
    open_folder = Path("/var/lib") / f"craft-test-open-{machine.name}"
    open_folder.mkdir()
    open_folder.chmod(0o1777)
    targets = {
        "tmp": Path("/tmp") / f"craft-test-{os.getpid()}-{machine.name}",
        "var_tmp": Path("/var/tmp") / f"craft-test-{os.getpid()}-{machine.name}",
        "open": open_folder / "left-behind.txt",
    }
    results = {}
    for uids in ("off", "on"):
        contain(settings, uids)
        _, agent = open_agent(owner)
        probes = ask(agent, "probe " + " ".join(f"write:{path}" for path in targets.values()))
        results[uids] = {
            name: (probes[f"write:{path}"], path.exists()) for name, path in targets.items()
        }
        for path in targets.values():
            path.unlink(missing_ok=True)
        agent_connections.stop_all()
        Sandbox.objects.all().delete()
    open_folder.rmdir()
    assert results["off"] == dict.fromkeys(targets, ("ok", True))
    assert results["on"] == {
        "tmp": ("ok", False),  # its own /tmp, gone with it
        "var_tmp": ("ok", False),
        "open": ("error: EROFS", False),  # the machine is read-only to it
    }
