"""What a local agent sees of the machine: bubblewrap's namespaces around every agent.

With sandbox users on, the local backend starts every agent inside bubblewrap (`bwrap`, the
sandboxing tool Flatpak is built on), then switches to the sandbox's uid with setpriv:

* **a PID namespace of its own**, ended with the agent: when the agent exits or Craft stops
  it, the kernel kills every process left in the namespace, however it forked (double fork,
  `setsid`) and whatever signals it ignores. `--die-with-parent` does the same when the server
  process dies. Its /proc shows the agent's own processes only (no other command lines).
* **the machine read-only**: every mount is bound read-only, except the sandbox's own folder
  (its home, tmp and workspaces). So the files an agent can leave behind are in its sandbox's
  folder and nowhere else, and a uid is clean once that folder is gone.
* **memory-backed /tmp, /var/tmp and /dev/shm of its own**, a minimal /dev, and System V IPC
  of its own: gone with the agent. What the agent needs from the machine's /tmp (its command,
  when a path on its command line is there, and Craft's tools) is bound in read-only.
* **none of the machine's Unix sockets**: every socket file bound on the machine when the agent
  starts (PostgreSQL's, which often trusts every local user, MariaDB's, Docker's, ...) is
  covered with /dev/null in the agent's view. Sockets bound later are not: say so in the
  README. TCP and UDP to the machine's own addresses are the network rule's job (`firewall`).
* **no new privileges** (a setuid program runs with the agent's rights). Where the sandbox
  has no budget of cgroups (`budget`; `CRAFT_SANDBOX_LIMITS=off`), at most
  `CRAFT_SANDBOX_PIDS` processes and threads for the whole sandbox by RLIMIT_NPROC, which
  counts per uid (a uid is one sandbox), zombies included and machine-wide.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from .containment import SYSTEM_PATH, SandboxUser, as_user

BWRAP = shutil.which("bwrap", path=SYSTEM_PATH)
SETPRIV = shutil.which("setpriv", path=SYSTEM_PATH)
PRLIMIT = shutil.which("prlimit", path=SYSTEM_PATH)
UNIX_SOCKETS = Path("/proc/net/unix")
# Replaced wholesale by bubblewrap, so nothing in them needs covering.
PRIVATE = (Path("/tmp"), Path("/var/tmp"), Path("/dev"), Path("/proc"))
# Of those, where an agent's command or Craft's tools may lie (a checkout under /tmp).
SHADOWED = (Path("/tmp"), Path("/var/tmp"))


def missing_tools() -> list[str]:
    """Return the programs the jail needs that this machine lacks (Debian package names)."""
    missing = []
    if BWRAP is None:
        missing.append("bubblewrap")
    if SETPRIV is None or PRLIMIT is None:
        missing.append("util-linux")
    return missing


def jailed(
    argv: list[str],
    *,
    sandbox: Path,
    workspace: Path,
    user: SandboxUser,
    sandbox_root: Path,
    tools: Path,
    binds: tuple[tuple[Path, str], ...] = (),
    uid_nproc: bool = True,
) -> list[str]:
    """Return the argv that runs `argv` as `user` in `workspace`, inside the jail.

    `binds` mounts more folders, writable, at places under the jail's own /tmp: Craft's
    workspace tool gets the session's checkpoint store so, and agents never do. `uid_nproc`
    holds CRAFT_SANDBOX_PIDS by RLIMIT_NPROC: for a sandbox without the pids controller.
    """
    assert BWRAP is not None and SETPRIV is not None and PRLIMIT is not None
    jail = [
        BWRAP,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--new-session",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
    ]  # fmt: skip
    for private in ("/tmp", "/var/tmp", "/dev/shm"):
        jail += ["--perms", "1777", "--tmpfs", private]
    if Path("/run/lock").is_dir():
        jail += ["--perms", "1777", "--tmpfs", "/run/lock"]
    # The folders above shadow the machine's: bring back what the agent needs from them.
    made: set[Path] = set()
    needed = [tools, *(Path(arg) for arg in argv if arg.startswith("/"))]
    for path in dict.fromkeys(needed):
        if path.exists() and _shadowed(path):
            jail += [*_folders_above(path, made), "--ro-bind", str(path), str(path)]
    jail += [*_folders_above(sandbox, made), "--bind", str(sandbox), str(sandbox)]
    for source, target in binds:
        assert target.startswith("/tmp/")
        jail += ["--bind", str(source), target]
    for socket_path in machine_sockets(outside=sandbox_root):
        jail += ["--ro-bind", "/dev/null", str(socket_path)]
    # bwrap sets PWD for --chdir; the environment stays exactly the one Craft gives.
    jail += ["--chdir", str(workspace), "--unsetenv", "PWD", "--"]
    pids = settings.CRAFT_SANDBOX_PIDS
    if pids and uid_nproc:
        jail += [PRLIMIT, f"--nproc={pids}:{pids}", "--"]
    return [*jail, *as_user(user), *argv]


def _shadowed(path: Path) -> bool:
    return any(path.is_relative_to(folder) for folder in SHADOWED)


def _folders_above(path: Path, made: set[Path]) -> list[str]:
    """Return the bwrap arguments that create the folders above `path` in a shadowed folder,
    passable by everyone (bwrap would make them 0700, closing them to the sandbox's user)."""
    arguments: list[str] = []
    for folder in reversed(path.parents):
        if _shadowed(folder) and folder not in SHADOWED and folder not in made:
            made.add(folder)
            arguments += ["--perms", "0711", "--dir", str(folder)]
    return arguments


def machine_sockets(outside: Path) -> list[Path]:
    """Return the Unix socket files bound on this machine now, but those under `outside`
    (the sandboxes' own) and in the folders the jail replaces."""
    found: dict[Path, None] = {}
    for raw in _bound_paths():
        path = Path(os.path.realpath(raw))
        if path.is_relative_to(outside) or any(path.is_relative_to(p) for p in PRIVATE):
            continue
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found[path] = None
        except OSError:
            continue  # gone, or bound in another mount namespace
    return list(found)


def _bound_paths() -> Iterator[str]:
    """Yield the path of every pathname Unix socket in /proc/net/unix (listening or not)."""
    try:
        lines = UNIX_SOCKETS.read_text(errors="replace").splitlines()[1:]
    except OSError:
        return
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            yield fields[7]
