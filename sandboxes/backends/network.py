"""A network of the sandbox's own: a network namespace per local sandbox, joined to the
outside by pasta running as the sandbox's user.

Each sandbox with sandbox users and `CRAFT_SANDBOX_NETWORK=isolated` gets a network namespace
(`ip netns`, named `craft-<first uid>-<sandbox id>`) that every agent of the sandbox joins
(`nsenter --net`, before bubblewrap). So its agents (and later its terminals) have:

* **a loopback of their own**: a dev server, a test database or opencode's own API on
  127.0.0.1 or ::1 is reachable by the sandbox's processes and by nobody else;
* **none of this machine's addresses**: 127.0.0.1 is the sandbox's own, and the machine's
  interface addresses are copied into the namespace, so they are the sandbox's own too;
* **abstract Unix sockets and /proc/net of their own** (both are per network namespace).

The way out is pasta (Debian's `passt`: a user-mode TCP/UDP/ICMP translator, as rootless
Podman uses), one process per sandbox, running **as the sandbox's uid**: whatever an agent
sends out becomes a socket of that uid on this machine, so the nftables rule on the sandbox
uids (`firewall`) still rejects this machine's addresses and link-local ones, and lets the
internet through. Endpoints of `CRAFT_SANDBOX_ALLOW` on this machine's loopback are
forwarded into the namespace at the same port (pasta's `-T`/`-U`): an agent reaches a local
model server at 127.0.0.1:11434 as it would without the namespace.

Why pasta as the sandbox's uid: the namespace is made by root, so the agents have no
capability in it (a namespace owned by a user namespace of theirs would hand them
CAP_NET_ADMIN there: the kernel surface `unshare -Urn` opens, which the jail refuses). pasta
needs CAP_SYS_ADMIN to join it, given as an ambient capability to that one process; it keeps
only that, in a mount namespace of its own, under its own seccomp filter. A veth pair with
NAT would need forwarding turned on for the machine and a relay for the loopback endpoints.

The namespace outlives server processes (several workers share a sandbox's network) and
goes with the sandbox: terminating kills every process of its uid (pasta included) and
deletes the namespace; the reaper removes those of sandboxes that are gone, and restarts a
pasta that died (agents in the namespace get their way out back). Everything about one
network lies in `/run` (root's): it is gone after a reboot, and made again at the next start.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from .base import SandboxError
from .containment import SYSTEM_PATH, SandboxUser, install_file
from .firewall import RESOLV_CONF, Endpoint

logger = logging.getLogger(__name__)

# The endpoints of CRAFT_SANDBOX_ALLOW: (address, port) pairs.
Allowed = list[tuple[Any, int]]

PASTA = shutil.which("pasta", path=SYSTEM_PATH)
IP = shutil.which("ip", path=SYSTEM_PATH)
NSENTER = shutil.which("nsenter", path=SYSTEM_PATH)
SETPRIV = shutil.which("setpriv", path=SYSTEM_PATH)
NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps named namespaces
STATE_DIR = Path("/run/craft-sandboxes")  # what Craft knows of each (root's, 0711)
# Where the namespace sends DNS queries when this machine's name servers are on loopback
# (systemd-resolved's 127.0.0.53, say), which is the sandbox's own loopback in there: pasta
# answers it from the machine's first name server (`--dns-forward`), and the jail's
# resolv.conf names it. An address of the documentation range: never a real server.
DNS_FORWARD = "192.0.2.53"
# pasta's own tap device in the namespace.
INTERFACE = "eth0"
START_TIMEOUT = 30


def missing_tools() -> list[str]:
    """Return the Debian packages a network of the sandbox's own needs and this machine
    lacks."""
    missing = []
    if PASTA is None:
        missing.append("passt")
    if IP is None:
        missing.append("iproute2")
    if NSENTER is None or SETPRIV is None:
        missing.append("util-linux")
    return missing


def name(first_uid: int, sandbox_id: UUID) -> str:
    """Name a sandbox's namespace after the installation (its uid range, as the firewall's
    table is) and the sandbox, so that two installations on a machine never touch each
    other's."""
    return f"craft-{first_uid}-{UUID(str(sandbox_id))}"


def path(first_uid: int, sandbox_id: UUID) -> Path:
    """Return the file that stands for a sandbox's namespace (`nsenter --net=` takes it)."""
    return NETNS_DIR / name(first_uid, sandbox_id)


def enter(first_uid: int, sandbox_id: UUID) -> list[str]:
    """Return the argv prefix that runs a command in the sandbox's namespace (as root, before
    the jail drops to the sandbox's user)."""
    assert NSENTER is not None
    return [NSENTER, f"--net={path(first_uid, sandbox_id)}", "--"]


def loopback_forwards(allow: Allowed) -> list[int]:
    """Return the ports of the allowed endpoints on this machine's loopback, forwarded into
    every sandbox's namespace."""
    return sorted({e.port for e in map(Endpoint._make, allow) if e.address.is_loopback})


def name_servers_on_loopback(resolv_conf: Path = RESOLV_CONF) -> bool:
    """Return whether this machine resolves names through a server on its loopback only."""
    servers = []
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    servers.append(ipaddress.ip_address(words[1].split("%")[0]))
    return bool(servers) and all(server.is_loopback for server in servers)


def sandbox_resolv_conf(resolv_conf: Path = RESOLV_CONF) -> str:
    """Return the resolv.conf the jail shows when name servers are on loopback: this
    machine's, its name servers replaced by pasta's forwarding address."""
    lines = [f"nameserver {DNS_FORWARD}"]
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            words = line.split()
            if words and words[0] in ("search", "domain", "options"):
                lines.append(line)
    return "\n".join(lines) + "\n"


def resolv_conf(first_uid: int) -> Path | None:
    """Return the resolv.conf the jail shows when this machine's name servers are on its
    loopback (pasta forwards the sandbox's queries to them), else None (the machine's own)."""
    if not name_servers_on_loopback():
        return None
    path = _state_dir(first_uid) / "resolv.conf"
    install_file(path, sandbox_resolv_conf().encode(), 0o644)
    return path


def is_up(first_uid: int, sandbox_id: UUID, user: SandboxUser, allow: Allowed) -> bool:
    """Return whether the sandbox's namespace is there with its pasta running for `allow`."""
    state_file = _state_dir(first_uid) / f"{UUID(str(sandbox_id))}.json"
    return path(first_uid, sandbox_id).exists() and _running(
        _read_state(state_file), _pasta_spec(user, allow)
    )


def ensure(
    first_uid: int,
    sandbox_id: UUID,
    user: SandboxUser,
    allow: Allowed,
    within: Callable[[list[str]], list[str]] = list,
) -> Path:
    """Return the sandbox's namespace, with its pasta running for `allow`: made now, or the
    one there is (pasta started again if it died, or if the allowed endpoints changed).
    `within` wraps pasta's command (to start it in the sandbox's cgroup, say).

    Safe to call from several threads and server processes at once (a lock per sandbox).
    Raise SandboxError, saying why, when it cannot be made.
    """
    netns = path(first_uid, sandbox_id)
    wanted = _pasta_spec(user, allow)
    state_file = _state_dir(first_uid) / f"{UUID(str(sandbox_id))}.json"
    if netns.exists() and _running(_read_state(state_file), wanted):
        return netns  # the common case: no lock, no process started
    with _locked(_state_dir(first_uid) / f"{UUID(str(sandbox_id))}.lock"):
        state = _read_state(state_file)
        if netns.exists() and _running(state, wanted):
            return netns
        _stop_pasta(state)
        pid_file = state_file.with_suffix(".pid")
        if not netns.exists():
            _run([IP, "netns", "add", netns.name], "make the sandbox's network namespace")
            _run([IP, "-n", netns.name, "link", "set", "lo", "up"], "bring its loopback up")
        pid = _start_pasta(within(pasta_argv(netns, user, allow, pid_file)), user, pid_file)
        state = {**wanted, "pid": pid, "start": _start_time(pid)}
        install_file(state_file, json.dumps(state).encode(), 0o600)
        logger.info(
            "sandbox %s has a network of its own (pasta pid %d, loopback ports forwarded: %s)",
            sandbox_id,
            pid,
            ", ".join(map(str, wanted["forwards"])) or "none",
        )
    return netns


def remove(first_uid: int, sandbox_id: UUID) -> None:
    """Stop the sandbox's pasta and delete its namespace (both gone is fine)."""
    directory = _state_dir(first_uid)
    state_file = directory / f"{UUID(str(sandbox_id))}.json"
    with _locked(directory / f"{UUID(str(sandbox_id))}.lock"):
        _stop_pasta(_read_state(state_file))
        netns = path(first_uid, sandbox_id)
        if netns.exists():
            _run([IP, "netns", "delete", netns.name], "delete the sandbox's network namespace")
        for suffix in (".json", ".pid"):
            with contextlib.suppress(FileNotFoundError):
                state_file.with_suffix(suffix).unlink()
    with contextlib.suppress(FileNotFoundError):
        (directory / f"{UUID(str(sandbox_id))}.lock").unlink()


def remove_installation(first_uid: int) -> None:
    """Remove every sandbox network of the installation and what Craft kept of them (tests;
    an operator turning networks off, or taking an installation away)."""
    for sandbox_id in sandbox_ids(first_uid):
        remove(first_uid, sandbox_id)
    shutil.rmtree(STATE_DIR / str(first_uid), ignore_errors=True)


def sandbox_ids(first_uid: int) -> list[UUID]:
    """Return the sandboxes of this installation that have a namespace on this machine."""
    prefix = f"craft-{first_uid}-"
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in NETNS_DIR.iterdir():
            if entry.name.startswith(prefix):
                with contextlib.suppress(ValueError):
                    found.append(UUID(entry.name.removeprefix(prefix)))
    return found


# --- reaching into the namespace ----------------------------------------------------------

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
# The one thread that enters sandboxes' namespaces (setns moves the calling thread only). It
# does nothing else, so it never needs to come back to this machine's namespace: each job
# enters the namespace it needs first.
_entering = ThreadPoolExecutor(max_workers=1, thread_name_prefix="craft-netns")
_libc = ctypes.CDLL(None, use_errno=True)


def run_inside(first_uid: int, sandbox_id: UUID, job: Callable[[], T]) -> T:
    """Return what `job` returns, run by a thread inside the sandbox's network namespace.

    What it makes there stays there: a socket it creates connects within the namespace (to
    the sandbox's own loopback) from whichever thread uses it later, and `/proc/thread-self/
    net` is the namespace's. Raise SandboxError when the sandbox has no network (yet).
    """
    return _entering.submit(_enter_and_run, path(first_uid, sandbox_id), job).result()


def _enter_and_run(netns: Path, job: Callable[[], T]) -> T:
    try:
        fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError("the sandbox's network is not up (its agent has not started)") from exc
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise SandboxError(f"cannot enter the sandbox's network: {os.strerror(error)}")
    finally:
        os.close(fd)
    return job()


# --- pasta ----------------------------------------------------------------------------------


def _pasta_spec(user: SandboxUser, allow: Allowed) -> dict[str, Any]:
    """What a running pasta must have been started with to serve the sandbox as it is now."""
    return {
        "uid": user.uid,
        "forwards": loopback_forwards(allow),
        "dns_forward": name_servers_on_loopback(),
    }


def pasta_argv(netns: Path, user: SandboxUser, allow: Allowed, pid_file: Path) -> list[str]:
    """Return the command that starts the sandbox's pasta: as its uid, able to join the
    namespace (and configure its interface) and nothing more, forwarding no port of this
    machine into the sandbox but the allowed loopback endpoints, and none out of it."""
    assert PASTA is not None and SETPRIV is not None
    ports = ",".join(map(str, loopback_forwards(allow))) or "none"
    argv = [
        SETPRIV,
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--clear-groups",
        "--inh-caps=+sys_admin,+net_admin",
        "--ambient-caps=+sys_admin,+net_admin",
        "--",
        PASTA,
        "--config-net",
        f"--netns={netns}",
        "--ns-ifname", INTERFACE,
        # Nothing of the sandbox is reachable from this machine (its ports are its own)...
        "--tcp-ports", "none",
        "--udp-ports", "none",
        # ... and nothing of this machine's loopback from the sandbox, but what is allowed.
        "--tcp-ns", ports,
        "--udp-ns", ports,
        # The gateway is the real one: never this machine's loopback in disguise.
        "--no-map-gw",
        "--quiet",
        "--pid", str(pid_file),
    ]  # fmt: skip
    if name_servers_on_loopback():
        argv += ["--dns-forward", DNS_FORWARD]
    return argv


def _start_pasta(argv: list[str], user: SandboxUser, pid_file: Path) -> int:
    """Run `argv` (pasta's, for a namespace); return pasta's pid once the namespace is
    configured (pasta goes to the background only then)."""
    # pasta writes its pid file as the sandbox's uid, in root's folder: made for it here.
    with contextlib.suppress(FileNotFoundError):
        pid_file.unlink()
    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.fchown(fd, user.uid, user.gid)
    os.close(fd)
    try:
        result = subprocess.run(
            argv,
            env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"cannot start the sandbox's network (pasta): {exc}") from exc
    said = " ".join(result.stderr.split())[:300]
    if result.returncode != 0:
        raise SandboxError(
            f"cannot start the sandbox's network: pasta exited with {result.returncode}"
            + (f" ({said})" if said else "")
        )
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise SandboxError("the sandbox's network started, but pasta left no pid") from exc
    if not _is_pasta(pid, user.uid):
        raise SandboxError("the sandbox's network (pasta) stopped right after it started")
    return pid


def _running(state: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Return whether the pasta this state describes still runs, started as `wanted`."""
    if not state or any(state.get(key) != value for key, value in wanted.items()):
        return False
    pid = state.get("pid")
    return (
        isinstance(pid, int)
        and _is_pasta(pid, state["uid"])
        and (_start_time(pid) == state.get("start"))
    )


def _stop_pasta(state: dict[str, Any] | None) -> None:
    """SIGKILL the pasta this state describes, if that very process still runs."""
    if not state or not isinstance(state.get("pid"), int):
        return
    pid = state["pid"]
    if _is_pasta(pid, state.get("uid")) and _start_time(pid) == state.get("start"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _is_pasta(pid: int, uid: object) -> bool:
    """Return whether `pid` is a live pasta of `uid` (pasta runs as `passt*` once started)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return (
        fields.get("Name", "").strip().startswith(("pasta", "passt"))
        and fields.get("State", "").split()[:1] not in (["Z"], ["X"])
        and fields.get("Uid", "").split()[:1] == [str(uid)]
    )


def _start_time(pid: int) -> int | None:
    """Return when `pid` started (clock ticks since boot): a pid reused later differs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


# --- files ----------------------------------------------------------------------------------


def _state_dir(first_uid: int) -> Path:
    """Return root's folder of this installation's network state (sandbox users may pass
    through it to the pid file pasta writes as them, not list it)."""
    directory = STATE_DIR / str(first_uid)
    directory.mkdir(parents=True, exist_ok=True)
    STATE_DIR.chmod(0o711)
    directory.chmod(0o711)
    return directory


def _read_state(state_file: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run(argv: list[str | None], what: str) -> None:
    try:
        result = subprocess.run(
            [str(arg) for arg in argv], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"cannot {what}: {exc}") from exc
    if result.returncode != 0:
        said = " ".join(result.stderr.split())[:300] or f"exit code {result.returncode}"
        raise SandboxError(f"cannot {what}: {said}")
