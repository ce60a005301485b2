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
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from craft import session_activity
from sandboxes import reaper, services
from sandboxes.backends import SandboxError, firewall, forget_backends, jail
from sandboxes.connections import agent_connections
from sandboxes.models import Sandbox
from tests.ready import open_ready_session

from .hostile import ask, contain, needs_root, open_agent, processes_of

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
    expected |= {target: refused if "unix" in blocked else "ok" for target in sockets}
    expected |= dict.fromkeys(reachable, "ok")
    assert results == expected


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


def test_sandboxes_refuse_to_start_without_their_isolation(settings, machine, owner, monkeypatch):
    contain(settings, "on")
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
    # World-writable, like /tmp, and outside it: anyone could leave files here.
    open_folder = Path("/run") / f"craft-test-open-{machine.name}"
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
