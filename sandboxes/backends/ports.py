"""The TCP ports listening in a sandbox, read from the kernel's tables (`/proc/net/tcp{,6}`).

A preview (docs/workbench.md) offers the ports an app listens on in the sandbox. The tables
are those of the network namespace they are read in: the sandbox's own (a local sandbox with
a network of its own, a pod), or this machine's, then narrowed to the sandbox's own sockets
by their owner's uid or by the processes that hold them.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .base import SandboxError

TABLES = ("tcp", "tcp6")
LISTEN = "0A"  # the kernel's TCP_LISTEN, as the tables spell a socket's state
# Tables of this many bytes at most are read: thousands of sockets.
MAX_TABLE_BYTES = 4 << 20


@dataclass(frozen=True)
class Listening:
    """One listening socket of a table."""

    port: int
    uid: int
    inode: int


def parse(table: str) -> list[Listening]:
    """Return the listening sockets of a `/proc/net/tcp` or `tcp6` table's text (its header
    and lines that do not parse are skipped)."""
    found = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        try:
            port = int(fields[1].rsplit(":", 1)[1], 16)
            found.append(Listening(port, int(fields[7]), int(fields[9])))
        except (IndexError, ValueError):
            continue
    return found


def ports(sockets: Iterable[Listening], exclude: Iterable[int] = ()) -> list[int]:
    """Return the distinct ports of `sockets` but those of `exclude`, in order."""
    excluded = set(exclude)
    return sorted({found.port for found in sockets if found.port and found.port not in excluded})


def read_tables(folder: str = "/proc/net") -> str:
    """Return this thread's network namespace's TCP tables (`folder`), run together."""
    texts = []
    for name in TABLES:
        # No tcp6 without IPv6 on this machine.
        path = os.path.join(folder, name)
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as table:
            texts.append(table.read(MAX_TABLE_BYTES).decode("ascii", "replace"))
    return "\n".join(texts)


def socket_inodes_under(folder: Path, proc: Path = Path("/proc")) -> set[int]:
    """Return the inodes of the sockets held by this machine's processes whose working
    directory is `folder` or inside it (a sandbox's processes, when sandboxes have no user of
    their own). Processes that end or that cannot be looked at meanwhile are skipped."""
    inodes: set[int] = set()
    root = str(folder.resolve())
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            if cwd != root and not cwd.startswith(root + os.sep):
                continue
            fds = os.listdir(entry / "fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(entry / "fd" / fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def read_tables_here() -> str:
    """Return the TCP tables of the calling thread's network namespace (one that entered a
    sandbox's sees the sandbox's; `/proc/net` is the process's)."""
    return read_tables("/proc/thread-self/net")


def connect_loopback(
    make: Callable[[socket.AddressFamily], socket.socket], port: int, timeout: float
) -> socket.socket:
    """Return a blocking socket, made by `make`, connected to `port` on loopback: 127.0.0.1,
    else ::1 (an app listening on IPv6 only). Raise SandboxError naming the port when
    neither answers."""
    problem: OSError | None = None
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        connection = make(family)
        try:
            connection.settimeout(timeout)
            connection.connect((address, port))
        except OSError as exc:
            connection.close()
            problem = problem or exc
            continue
        connection.settimeout(None)
        return connection
    reason = problem.strerror if problem and problem.strerror else str(problem)
    raise SandboxError(f"nothing answers on port {port} in the sandbox ({reason})")
