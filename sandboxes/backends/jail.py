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
* **memory-backed /tmp, /var/tmp, /dev/shm and /run of its own**, a minimal /dev, and System V
  IPC of its own: gone with the agent. What the agent needs from the machine's /tmp (the
  installation its command belongs to, when a path on its command line is there, and Craft's
  tools) is bound in read-only (`install_folders` says which).
* **no other sandbox**: the sandbox root is an empty folder in its view but for its own
  sandbox and Craft's tools, so another sandbox's files, sockets and checkpoint stores are
  not even there.
* **none of the machine's Unix sockets**: /run (where services keep them) is its own, and
  every other socket file bound on the machine when the agent starts (PostgreSQL's, which
  often trusts every local user, MariaDB's, Docker's, ...) is covered with /dev/null in the
  agent's view. Abstract sockets belong to a network namespace: the sandbox's own
  (`network`), where also TCP and UDP to the machine's own addresses end (or, with
  `CRAFT_SANDBOX_NETWORK=open`, nothing of that).
* **no new privileges** (a setuid program runs with the agent's rights), and **no user
  namespaces** (`seccomp`). Where the sandbox has no budget of cgroups (`budget`;
  `CRAFT_SANDBOX_LIMITS=off`), at most `CRAFT_SANDBOX_PIDS` processes and threads for the
  whole sandbox by RLIMIT_NPROC, which counts per uid (a uid is one sandbox), zombies
  included and machine-wide.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from . import seccomp
from .containment import SYSTEM_PATH, SandboxUser, as_user

BWRAP = shutil.which("bwrap", path=SYSTEM_PATH)
SETPRIV = shutil.which("setpriv", path=SYSTEM_PATH)
PRLIMIT = shutil.which("prlimit", path=SYSTEM_PATH)
UNIX_SOCKETS = Path("/proc/net/unix")
RESOLV_CONF = Path("/etc/resolv.conf")
# Replaced wholesale by bubblewrap, so nothing in them needs covering.
PRIVATE = (Path("/tmp"), Path("/var/tmp"), Path("/dev"), Path("/proc"), Path("/run"))
# Of those, where an agent's command or Craft's tools may lie (a checkout under /tmp).
SHADOWED = (Path("/tmp"), Path("/var/tmp"))
# Stands in the argv for the descriptor of the seccomp filter, opened anew for each start
# (`passing_filter`): bubblewrap reads it once.
SECCOMP_FD = "{seccomp filter}"


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
    network: Path | None = None,
    no_network: bool = False,
    resolv_conf: Path | None = None,
    binds: tuple[tuple[Path, str], ...] = (),
    read_only_binds: tuple[tuple[Path, str], ...] = (),
    read_only_sandbox: bool = False,
    uid_nproc: bool = True,
) -> list[str]:
    """Return the argv that runs `argv` as `user` in `workspace`, inside the jail.

    `network` is the sandbox's network namespace, joined before the jail (None: this
    machine's network, `CRAFT_SANDBOX_NETWORK=open`); `no_network` gives the command a
    network of nothing but a loopback of its own (Craft's workspace tool needs none).
    `resolv_conf`, when given, is shown as /etc/resolv.conf. `binds` mounts more folders,
    writable, at places under the jail's own /tmp: Craft's workspace tool gets the session's
    checkpoint store so, and agents never do; `read_only_binds` the same, read-only.
    `read_only_sandbox` mounts the sandbox's folder read-only (Craft's git, where it holds a
    token, must not write the workspace). `uid_nproc` holds CRAFT_SANDBOX_PIDS by
    RLIMIT_NPROC: for a sandbox without the pids controller. The argv holds `SECCOMP_FD`:
    start it with `passing_filter`.
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
    if no_network:
        jail.append("--unshare-net")
    for private in ("/tmp", "/var/tmp", "/dev/shm", "/run", "/run/lock"):
        jail += ["--perms", "1777" if private != "/run" else "0755", "--tmpfs", private]
    # The folders above shadow the machine's: bring back what the agent needs from them.
    made: set[Path] = set()
    needed = [Path(arg) for arg in argv if arg.startswith("/")]
    folders = [folder for path in needed if path.exists() for folder in install_folders(path)]
    for folder in dict.fromkeys(folders):
        if not folder.is_relative_to(sandbox_root):
            jail += [*_folders_above(folder, made), "--ro-bind", str(folder), str(folder)]
    # No other sandbox: an empty root but for Craft's tools and this sandbox (mounted after
    # it, on top of it).
    jail += [*_folders_above(sandbox_root, made), "--perms", "0711", "--tmpfs", str(sandbox_root)]
    for folder in reversed(tools.parents):  # passable, as bwrap would make them 0700
        if folder.is_relative_to(sandbox_root) and folder != sandbox_root:
            jail += ["--perms", "0711", "--dir", str(folder)]
    sandbox_bind = "--ro-bind" if read_only_sandbox else "--bind"
    jail += ["--ro-bind", str(tools), str(tools), sandbox_bind, str(sandbox), str(sandbox)]
    for source, target in binds:
        assert target.startswith("/tmp/")
        jail += ["--bind", str(source), target]
    for source, target in read_only_binds:
        assert target.startswith("/tmp/")
        jail += ["--ro-bind", str(source), target]
    for socket_path in machine_sockets(outside=sandbox_root):
        jail += ["--ro-bind", "/dev/null", str(socket_path)]
    jail += _name_resolution(resolv_conf)
    # bwrap sets PWD for --chdir; the environment stays exactly the one Craft gives.
    jail += ["--seccomp", SECCOMP_FD, "--chdir", str(workspace), "--unsetenv", "PWD", "--"]
    pids = settings.CRAFT_SANDBOX_PIDS
    if pids and uid_nproc:
        jail += [PRLIMIT, f"--nproc={pids}:{pids}", "--"]
    enter = [] if network is None else _enter(network)
    return [*enter, *jail, *as_user(user), *argv]


@contextlib.contextmanager
def passing_filter(argv: list[str]) -> Iterator[tuple[list[str], tuple[int, ...]]]:
    """Yield `argv` with the seccomp filter's descriptor in place of `SECCOMP_FD`, and the
    descriptors to pass to the process; close the descriptor once the process is started."""
    if SECCOMP_FD not in argv:
        yield argv, ()
        return
    fd = seccomp.program_fd()
    try:
        yield [str(fd) if arg == SECCOMP_FD else arg for arg in argv], (fd,)
    finally:
        os.close(fd)


def install_folders(path: Path) -> list[Path]:
    """Return the folders to bind, read-only, into the jail for `path` (a command, a file on
    its command line) to work there: none when the jail shows it already.

    Only what lies in a folder the jail replaces (/tmp, /var/tmp) needs binding. Then, for the
    path as given and for its real path (a link under /tmp may lead into an installation
    under /tmp): the outermost `node_modules` above it (npm puts a package's dependencies
    beside it, and `.bin` links into them), else the virtualenv it belongs to (the folder
    holding `pyvenv.cfg`), else the installation prefix it is in (the folder above a `bin`),
    else its folder. A script's `#!` interpreter counts as a path of its own.
    """
    found: dict[Path, None] = {}
    for candidate in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        if _shadowed(candidate):
            found[_installation(candidate)] = None
    for interpreter in _interpreter(path):
        found.update(dict.fromkeys(install_folders(interpreter)))
    return list(found)


def _installation(path: Path) -> Path:
    parents = [p for p in path.parents if _shadowed(p) and p not in SHADOWED]
    for parent in reversed(parents):  # outermost first
        if parent.name == "node_modules":
            return parent
    for parent in parents:  # innermost first
        if (parent / "pyvenv.cfg").is_file():
            return parent
    folder = path if path.is_dir() else path.parent
    if folder.name == "bin" and folder.parent in parents:
        return folder.parent
    return folder


def _interpreter(path: Path) -> list[Path]:
    """Return the interpreter a script names on its `#!` line (not `/usr/bin/env`), if any."""
    try:
        with open(path, "rb") as handle:
            first_line = handle.readline(256)
    except OSError:
        return []
    words = first_line[2:].split() if first_line.startswith(b"#!") else []
    if not words or words[0] == b"/usr/bin/env" or not words[0].startswith(b"/"):
        return []
    return [Path(os.fsdecode(words[0]))]


def _enter(network: Path) -> list[str]:
    nsenter = shutil.which("nsenter", path=SYSTEM_PATH) or "nsenter"
    return [nsenter, f"--net={network}", "--"]


def _name_resolution(resolv_conf: Path | None) -> list[str]:
    """Return the bwrap arguments that show `resolv_conf` (or the machine's own, which may
    lie in the replaced /run, as systemd-resolved's does) as /etc/resolv.conf."""
    target = Path(os.path.realpath(RESOLV_CONF))
    if resolv_conf is not None:
        return ["--ro-bind", str(resolv_conf), str(target)]
    if target.is_relative_to("/run") and target.is_file():
        return ["--ro-bind", str(target), str(target)]
    return []


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
