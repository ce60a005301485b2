"""The network rule that keeps local agents off this machine's own services.

Every local agent runs as a uid of the sandbox range (`CRAFT_SANDBOX_UID_BASE` ..
`+ CRAFT_SANDBOX_UID_COUNT - 1`), in its sandbox's network namespace (`network`), whose one
way out is the sandbox's pasta, running as that uid too: so whatever a sandbox sends out of
its namespace is a socket of its uid on this machine. One nftables table on the output hook
rejects what that range sends to:

* any address of this machine (`fib daddr type local`): 127.0.0.0/8 and ::1, and also the
  machine's own interface addresses, so a PostgreSQL, Redis or daphne listening on 0.0.0.0
  is covered as well as one on loopback;
* link-local addresses (169.254.0.0/16, fe80::/10), where cloud metadata services hand out
  the machine's credentials;

except the endpoints an operator lists in `CRAFT_SANDBOX_ALLOW` (a local model server, say)
and port 53 of a loopback name server named in /etc/resolv.conf, so that names still
resolve. Everything else (the internet, other machines) is left to the machine's own network.

Why a rule on the uid range beside the namespace: the kernel applies it to every socket of
the uid however it was made (pasta's, and any process of the uid outside a jail), and pasta
reaches this machine's addresses as any program does, so the namespace alone would not keep
them out.

Connections are rejected (a TCP reset, an ICMP error), not dropped: an agent's client fails
at once with "connection refused" instead of hanging until its timeout.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

from .base import SandboxError
from .containment import SYSTEM_PATH

logger = logging.getLogger(__name__)

NFT = shutil.which("nft", path=SYSTEM_PATH)
RESOLV_CONF = Path("/etc/resolv.conf")


class Endpoint(NamedTuple):
    """An address and port agents may reach although the rule would refuse it."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    def __str__(self) -> str:
        if self.address.version == 6:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


def table_name(first_uid: int) -> str:
    """Name the table after the uid range it guards: one installation, one table."""
    return f"craft_sandboxes_{first_uid}"


def loopback_name_servers(resolv_conf: Path = RESOLV_CONF) -> list[Endpoint]:
    """Return port 53 of each loopback name server in resolv.conf (127.0.0.53, say)."""
    found = []
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1].split("%")[0])
            except ValueError:
                continue
            if address.is_loopback:
                found.append(Endpoint(address, 53))
    return found


def ruleset(first_uid: int, count: int, allow: list[Endpoint]) -> str:
    """Return the nft script that (re)defines the table in one atomic transaction."""
    table = f"inet {table_name(first_uid)}"
    last = first_uid + count - 1
    sets = []
    for family, kind in ((4, "ipv4_addr"), (6, "ipv6_addr")):
        elements = [
            f"{e.address} . {proto} . {e.port}"
            for e in allow
            if e.address.version == family
            for proto in ("tcp", "udp")
        ]
        body = f"type {kind} . inet_proto . inet_service;"
        if elements:
            body += f" elements = {{ {', '.join(elements)} }};"
        sets.append(f"  set allowed{family} {{ {body} }}")
    rejected = "reject with icmpx admin-prohibited"
    return "\n".join(
        [
            # Adding then deleting makes the delete valid when the table does not exist yet;
            # the whole file is one transaction, so there is no moment without the rule.
            f"add table {table}",
            f"delete table {table}",
            f"table {table} {{",
            *sets,
            "  chain output {",
            "    type filter hook output priority filter; policy accept;",
            # Packets without a socket (the resets and ICMP errors this table itself sends
            # back) have no uid: a positive match lets them through.
            f"    meta skuid {first_uid}-{last} jump sandbox",
            "  }",
            "  chain sandbox {",
            "    ip daddr . meta l4proto . th dport @allowed4 accept",
            "    ip6 daddr . meta l4proto . th dport @allowed6 accept",
            "    fib daddr type local meta l4proto tcp reject with tcp reset",
            f"    fib daddr type local {rejected}",
            f"    ip daddr 169.254.0.0/16 {rejected}",
            f"    ip6 daddr fe80::/10 {rejected}",
            "  }",
            "}",
            "",
        ]
    )


def install(first_uid: int, count: int, allow: list[tuple[Any, int]]) -> None:
    """Put the rule in place for the uid range, replacing an earlier version of it.

    Raise SandboxError saying why when it cannot be (no nft, not root, a kernel without
    nftables), so that sandboxes refuse to start rather than run unguarded.
    """
    if NFT is None:
        raise SandboxError(
            "sandbox network isolation needs nftables (the nft command; Debian: apt-get install "
            "nftables). Set CRAFT_SANDBOX_NETWORK=open to run agents without it"
        )
    everything = [*(Endpoint(*pair) for pair in allow), *loopback_name_servers()]
    _nft(["-f", "-"], ruleset(first_uid, count, everything))
    if not is_installed(first_uid):
        raise SandboxError("the sandbox network rule did not stay in place after nft loaded it")
    logger.info(
        "sandbox uids %d to %d cannot reach this machine's addresses%s",
        first_uid,
        first_uid + count - 1,
        f" except {', '.join(map(str, everything))}" if everything else "",
    )


def is_installed(first_uid: int) -> bool:
    """Return whether the table is there with its hook (someone may flush the ruleset)."""
    if NFT is None:
        return False
    try:
        listing = _nft(["list", "chain", "inet", table_name(first_uid), "output"])
    except SandboxError:
        return False
    return "hook output" in listing and "jump sandbox" in listing


def remove(first_uid: int) -> None:
    """Delete the table (tests; an operator turning isolation off)."""
    if NFT is not None:
        subprocess.run(
            [NFT, "delete", "table", "inet", table_name(first_uid)],
            check=False,
            capture_output=True,
        )


def _nft(args: list[str], script: str | None = None) -> str:
    assert NFT is not None
    try:
        result = subprocess.run(
            [NFT, *args], input=script, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"cannot run nft for the sandbox network rule: {exc}") from exc
    if result.returncode != 0:
        reason = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.returncode}"]
        raise SandboxError(f"cannot put the sandbox network rule in place: {reason[0]}")
    return result.stdout
