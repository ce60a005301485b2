"""Free TCP ports on loopback for servers a test or a benchmark starts."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path


def free_port() -> int:
    """Return a TCP port on loopback that is free right now, below the kernel's ephemeral range.

    The port is used a moment later, by another process. One the kernel handed out (port 0)
    can meanwhile be handed out again: to a listener bound to port 0 (a worker's peer link),
    or as the local end of a connection. A port below that range is only ever taken by a
    choice like this one.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        # secrets, not random: a test that seeds random would give the workers one sequence.
        port = 10_000 + secrets.randbelow(max(low - 10_000, 1))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found below the ephemeral range")
