"""What keeps a local agent away from the server and from other sandboxes.

Two layers, both applied by the local backend to every agent it starts:

* **An explicit environment.** An agent never inherits the server's environment (which holds
  `DJANGO_SECRET_KEY`, `DATABASE_URL`, `REDIS_URL`, ...). It gets `PATH`, `HOME` and `TMPDIR`
  inside its sandbox, `USER`/`LOGNAME`, `SHELL`, the locale (`LANG`, `LANGUAGE`, `LC_*`), `TZ`
  and `TERM`, plus what the operator lists in `CRAFT_AGENT_ENV`, and nothing else.
* **A user of its own** (`CRAFT_SANDBOX_UIDS`). When the server runs as root, each sandbox gets
  an unprivileged uid and gid of its own from the range `CRAFT_SANDBOX_UID_BASE` ..
  `+ CRAFT_SANDBOX_UID_COUNT - 1`; its folder belongs to that uid with mode 0700 and its
  agents run as that uid with no supplementary groups. The folder's owner is the record of
  which uid a sandbox has: nothing else to keep in sync, and a uid is free again once its
  sandbox's folder is gone. The server's own files are closed to those uids: the sandbox root
  and `CRAFT_VAR_DIR` are 0711 (enter, not list) and a SQLite database 0600.

What it does not do is in the README ("What the local backend isolates").
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import pwd
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .base import SandboxError

logger = logging.getLogger(__name__)

# The agents' PATH: the tools folder first (the bundled demo agent), then the usual places.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Variables copied from the server's environment when it has them: locale and terminal only.
PASSED_THROUGH = ("LANG", "LANGUAGE", "TZ", "TERM")

# Inside the sandbox root: Craft's own folder (not a sandbox), holding the tools and a lock.
CRAFT_DIR = ".craft"
DEMO_AGENT = "craft-demo-agent"


@dataclass(frozen=True)
class SandboxUser:
    """The unprivileged user and group one sandbox's agents run as."""

    uid: int
    gid: int

    @property
    def name(self) -> str:
        return f"sandbox-{self.uid}"


def agent_environment(
    sandbox: Path,
    tools: Path,
    user: SandboxUser | None,
    chosen: dict[str, str | None] | None = None,
) -> dict[str, str]:
    """Return the whole environment of an agent of the sandbox whose folder is `sandbox`;
    `chosen` is what its catalog entry passes (default CRAFT_AGENT_ENV)."""
    env = {"LANG": "C.UTF-8", "TERM": "dumb", "SHELL": "/bin/sh"}
    for name, server_value in os.environ.items():
        if name in PASSED_THROUGH or name.startswith("LC_"):
            env[name] = server_value
    if chosen is None:
        chosen = settings.CRAFT_AGENT_ENV
    for name, value in chosen.items():
        if value is not None:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    env["PATH"] = f"{tools}{os.pathsep}{env.get('PATH', SYSTEM_PATH)}"
    login = user.name if user is not None else _server_login()
    env.update(
        HOME=str(sandbox / "home"),
        TMPDIR=str(sandbox / "tmp"),
        USER=login,
        LOGNAME=login,
    )
    return env


def _server_login() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


# --- may a sandbox user reach this? ----------------------------------------------------------


def others_can_enter(folder: Path) -> bool:
    """Return whether a user who is neither owner nor in the group can reach `folder`."""
    return closed_folder_above(folder) is None


def closed_folder_above(folder: Path) -> Path | None:
    """Return the first folder on the way to `folder` (itself included) that a user who is
    neither owner nor in the group cannot pass through, or None when every one lets them.

    Folders that do not exist yet count as passable: Craft creates them with the right mode.
    """
    path = Path(os.path.abspath(folder))
    for step in reversed([path, *path.parents]):
        try:
            mode = step.stat().st_mode
        except FileNotFoundError:
            continue  # created later by Craft, with the right mode
        except OSError:
            return step
        if not mode & stat.S_IXOTH:
            return step
    return None


def others_can_run(program: str) -> bool:
    """Return whether a user with no owner or group rights can execute `program`.

    Follows symbolic links (a virtualenv's python is a link into wherever Python lives) and the
    `#!` line of scripts, whose interpreter must be runnable too.
    """
    for path in dict.fromkeys([os.path.abspath(program), os.path.realpath(program)]):
        if not others_can_enter(Path(path).parent):
            return False
    try:
        mode = os.stat(program).st_mode
        with open(program, "rb") as handle:
            first_line = handle.readline(256)
    except OSError:
        return False
    if not mode & stat.S_IXOTH:
        return False
    if first_line.startswith(b"#!"):
        if not mode & stat.S_IROTH:
            return False
        interpreter = first_line[2:].split()
        if interpreter and interpreter[0] != b"/usr/bin/env":
            return others_can_run(os.fsdecode(interpreter[0]))
    return True


def sandbox_python(uids: bool) -> str:
    """Return a python3 for the bundled demo agent (standard library only).

    With sandbox users it must be one that every user can run: a virtualenv under a private
    home (pyenv in /root, say) is not, the system's /usr/bin/python3 is.
    """
    candidates = [sys.executable, shutil.which("python3", path=SYSTEM_PATH)]
    for candidate in candidates:
        if candidate and (not uids or others_can_run(candidate)):
            return candidate
    raise SandboxError(
        "no python3 that sandbox users can run, for the demo agent: install the system's "
        "python3 (e.g. apt-get install python3), or set CRAFT_AGENT_COMMAND to another agent"
    )


# --- sandbox users --------------------------------------------------------------------------


def sandbox_uids_enabled(root: Path) -> bool:
    """Decide, from CRAFT_SANDBOX_UIDS, whether agents run as sandbox users; explain once.

    As root they always do, unless the operator said `off`: whatever else is wrong (a sandbox
    root other users cannot enter, a missing tool) makes sandboxes refuse to start
    (`sandbox_root_problem`, the backend's `isolation_problem`), never run agents as root.
    Without root, `on` raises ImproperlyConfigured and `auto` runs agents as the server's
    own (unprivileged) user, the only one it has, and logs why.
    """
    mode = settings.CRAFT_SANDBOX_UIDS
    if mode == "off":
        _explain_once(
            "Sandbox users are off (CRAFT_SANDBOX_UIDS=off): agents run as the server's user "
            f"(uid {os.geteuid()}), outside the jail, with the network open; see the README, "
            "'What the local backend isolates'."
        )
        return False
    if os.geteuid() == 0:
        return True
    problem = f"the server runs as uid {os.geteuid()}, not root"
    if mode == "on":
        raise ImproperlyConfigured(f"CRAFT_SANDBOX_UIDS=on, but {problem}")
    _explain_once(
        f"Sandbox users are off (CRAFT_SANDBOX_UIDS=auto): {problem}. Agents run as the "
        "server's user and can read whatever it can, including other sandboxes; see the "
        "README, 'What the local backend isolates'."
    )
    return False


def sandbox_root_problem(root: Path) -> str:
    """Return why sandbox users could not reach their folders under `root`, or "".

    A sandbox's user must pass through every folder above its sandbox's: a checkout under
    /root (0700 on Debian) cannot serve them. Craft then refuses to start sandboxes rather
    than run their agents as root.
    """
    closed = closed_folder_above(root)
    if closed is None:
        return ""
    try:
        mode = f"mode {stat.S_IMODE(closed.stat().st_mode):o}"
    except OSError as exc:
        mode = exc.strerror or "unreadable"
    return (
        f"sandbox users cannot reach the sandbox root {root}: other users may not enter "
        f"{closed} ({mode}). Set CRAFT_SANDBOX_ROOT to a folder outside it (for example "
        "/var/lib/craft/sandboxes), or let other users pass through it (chmod o+x); "
        "CRAFT_SANDBOX_UIDS=off would run every agent as this server's user, outside the jail"
    )


_explained: set[str] = set()


def _explain_once(message: str) -> None:
    if message not in _explained:
        _explained.add(message)
        logger.warning(message)


class UidPool:
    """Hands each sandbox folder a uid of its own from the configured range.

    The owner of `<root>/<sandbox id>` is the sandbox's uid. Claims run under an exclusive
    lock on a file in the root, so two server processes never hand out one uid twice.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.first = settings.CRAFT_SANDBOX_UID_BASE
        self.count = settings.CRAFT_SANDBOX_UID_COUNT

    def owns(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock_path = self.root / CRAFT_DIR / "uids.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a sandbox user who could open it could hold the lock and stall provisioning.
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def assign(self, folder: Path) -> SandboxUser:
        """Return the user of `folder` (a sandbox's), giving it a uid of its own if it has none.

        A folder from before sandbox users were turned on is adopted: it and everything in it
        are given to the new uid.
        """
        owner = folder.stat().st_uid
        if self.owns(owner):
            return SandboxUser(owner, owner)
        with self._locked():
            owner = folder.stat().st_uid
            if self.owns(owner):
                return SandboxUser(owner, owner)
            uid = self._free_uid(exclude=folder)
            user = SandboxUser(uid, uid)
            chown_tree(folder, user)
            folder.chmod(0o700)
            logger.info("sandbox folder %s now belongs to uid %d", folder.name, uid)
            return user

    def _free_uid(self, exclude: Path) -> int:
        """Return a uid that no sandbox folder owns, no account has and no process runs as.

        A process left by an earlier sandbox (one that escaped before the jail, or outlived a
        kill that failed) would otherwise be handed the next sandbox's files and agents.
        Files are not looked for elsewhere: jailed agents can write only in their sandbox's
        folder, and that folder is what marks the uid as taken.
        """
        used = set()
        for entry in self.root.iterdir():
            if entry != exclude and _is_uuid(entry.name):
                with contextlib.suppress(OSError):
                    used.add(entry.lstat().st_uid)
        used |= uids_of_processes()
        for uid in range(self.first, self.first + self.count):
            if uid not in used and not _has_account(uid):
                return uid
        raise SandboxError(
            f"no free sandbox uid: all {self.count} from {self.first} are taken "
            "(CRAFT_SANDBOX_UID_BASE, CRAFT_SANDBOX_UID_COUNT)"
        )

    def user_of(self, folder: Path) -> SandboxUser:
        """Return the sandbox user that owns `folder`; raise SandboxError if none does."""
        owner = folder.stat().st_uid
        if not self.owns(owner):
            raise SandboxError("the sandbox folder has no sandbox user; provision it again")
        return SandboxUser(owner, owner)


def uids_of_processes() -> set[int]:
    """Return every uid (real, effective, saved or filesystem) a live process here has.

    Read from /proc/<pid>/status, not from the owner of /proc/<pid>, which shows root for a
    process that made itself non-dumpable. Zombies (dead, not yet reaped) do not count.
    """
    uids: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
                        break
                    if line.startswith(b"Uid:"):
                        uids.update(int(field) for field in line.split()[1:])
                        break
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return uids


def as_user(user: SandboxUser) -> list[str]:
    """Return the argv prefix that runs a command as `user`, without new privileges."""
    return [
        shutil.which("setpriv", path=SYSTEM_PATH) or "setpriv",
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]


def kill_user_processes(user: SandboxUser, attempts: int = 20) -> None:
    """SIGKILL every process of `user` on this machine, however it forked or what it ignores.

    `kill -9 -1` run as the user signals every process the user may signal (its own), in
    one pass of the kernel over the process table, so a process forking meanwhile cannot slip
    through: its children are either seen or not created. Raise SandboxError if some remain.
    """
    kill = shutil.which("kill", path=SYSTEM_PATH) or "kill"
    for _ in range(attempts):
        if user.uid not in uids_of_processes():
            return
        subprocess.run([*as_user(user), kill, "-9", "-1"], capture_output=True, check=False)
        time.sleep(0.01)  # SIGKILLed processes leave /proc once the kernel has run their exit
    if user.uid in uids_of_processes():
        raise SandboxError(f"processes of uid {user.uid} are still running after SIGKILL")


def _is_uuid(name: str) -> bool:
    try:
        UUID(name)
    except ValueError:
        return False
    return True


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def chown_tree(folder: Path, user: SandboxUser) -> None:
    """Give `folder` and everything in it to `user`, never following a link."""
    os.chown(folder, user.uid, user.gid, follow_symlinks=False)
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            os.chown(os.path.join(parent, name), user.uid, user.gid, follow_symlinks=False)


# Everything below a sandbox's folder belongs to the sandbox, which may have swapped any of it
# for a symbolic link (to /etc, to another sandbox) to make the server create, chown, chmod or
# delete something elsewhere. So the server works below a sandbox's folder only through
# folder file descriptors opened with O_NOFOLLOW, never by path.
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def private_folder(sandbox_folder: Path, parts: tuple[str, ...], user: SandboxUser | None) -> None:
    """Create `sandbox_folder/parts...`, each 0700 and owned by `user`, following no link.

    Raise SandboxError when one of them is not a folder (a link, a file).
    """
    fd = os.open(sandbox_folder, FOLDER)  # in the root-owned sandbox root: the sandbox's own
    try:
        for name in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            try:
                next_fd = os.open(name, FOLDER | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                where = "/".join(parts)
                raise SandboxError(
                    f"the sandbox's {where} is not a folder ({exc.strerror})"
                ) from exc
            os.close(fd)
            fd = next_fd
            if user is not None:
                os.fchown(fd, user.uid, user.gid)
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def remove_private_folder(sandbox_folder: Path, parts: tuple[str, ...]) -> None:
    """Remove `sandbox_folder/parts...` and what it holds, following no link (gone is fine)."""
    try:
        fd = os.open(sandbox_folder, FOLDER)
    except FileNotFoundError:
        return
    try:
        for name in parts[:-1]:
            try:
                next_fd = os.open(name, FOLDER | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return  # missing, or a link: nothing of ours to remove there
            os.close(fd)
            fd = next_fd
        name = parts[-1]
        try:
            is_folder = stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return
        if is_folder:
            shutil.rmtree(name, dir_fd=fd, ignore_errors=True)  # fd-based: follows no link
        else:
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def close_server_files(root: Path) -> None:
    """Keep sandbox users out of the server's own files.

    The sandbox root and `CRAFT_VAR_DIR` become 0711 (others may pass through to their own
    sandbox, not list or read), and a SQLite database with its journal files 0600. Runs
    before every agent start: cheap, and it also covers a database created after start-up.
    """
    root.mkdir(parents=True, exist_ok=True)
    _restrict(root, 0o711)
    var_dir = Path(settings.VAR_DIR)
    if var_dir.is_dir():
        _restrict(var_dir, 0o711 if root.resolve().is_relative_to(var_dir.resolve()) else 0o700)
    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3" and str(database["NAME"]) != ":memory:":
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = Path(f"{database['NAME']}{suffix}")
            if path.exists():
                _restrict(path, 0o600)


def _restrict(path: Path, mode: int) -> None:
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        path.chmod(current & mode)
        logger.info("closed %s to sandbox users (mode %o)", path, current & mode)
    elif mode & stat.S_IXOTH and not current & stat.S_IXOTH:
        path.chmod(current | stat.S_IXOTH)


def install_demo_agent(tools: Path, python: str) -> Path:
    """Install the bundled demo agent as `craft-demo-agent` in `tools`, runnable by all.

    As the sandbox image does: a copy of sandboxes/in_sandbox/demo_agent.py (standard library only),
    compiled, and a shell wrapper that runs it with `python` in isolated mode. Files are
    rewritten only when they changed, and atomically, so another process may be starting the
    agent meanwhile.
    """
    source = Path(__file__).resolve().parent.parent / "in_sandbox" / "demo_agent.py"
    tools.mkdir(parents=True, exist_ok=True)
    tools.chmod(0o755)
    tools.parent.chmod(0o755)
    _install_module(tools, source, python)
    command = shlex.join(module_command(python, tools, "demo_agent", "main()"))
    return install_file(tools / DEMO_AGENT, f'#!/bin/sh\nexec {command} "$@"\n'.encode(), 0o755)


def install_workspace_tool(tools: Path, python: str) -> Path:
    """Install the workspace tool (sandboxes/in_sandbox/workspace_tool.py) in `tools`, readable
    by all, compiled for `python`; run it with `module_command(python, tools, "workspace_tool")`."""
    source = Path(__file__).resolve().parent.parent / "in_sandbox" / "workspace_tool.py"
    tools.mkdir(parents=True, exist_ok=True)
    return _install_module(tools, source, python)


def install_git_tool(tools: Path, python: str) -> Path:
    """Install Craft's git tool (sandboxes/in_sandbox/git_tool.py) in `tools` as the workspace
    tool is; run it with `module_command(python, tools, "git_tool")`."""
    source = Path(__file__).resolve().parent.parent / "in_sandbox" / "git_tool.py"
    tools.mkdir(parents=True, exist_ok=True)
    return _install_module(tools, source, python)


def module_command(
    python: str, tools: Path, module: str, call: str = "main(sys.argv[1:])"
) -> list[str]:
    """Return the argv that runs `module` of `tools` (its arguments follow), standard library
    only: isolated (`-I`), without site-packages (`-S`).

    It is imported, not run as a script: Python compiles a script at every start (a few tens
    of milliseconds for these) but loads an imported module's bytecode from `__pycache__`,
    which `_install_module` writes. The tools folder comes after the standard library on the
    module path, so that nothing in it can stand for a standard module.
    """
    path = repr(str(tools))
    code = f"import sys; sys.path.append({path}); import {module}; sys.exit({module}.{call})"
    return [python, "-I", "-S", "-c", code]


def _install_module(tools: Path, source: Path, python: str) -> Path:
    """Install `source` in `tools` with its bytecode for `python`, readable by all.

    Without the bytecode (it could not be made), `python` compiles the module at each start,
    as it would a script: slower, never wrong. Stale bytecode is never used: Python checks it
    against the source's size and time, which its header records.
    """
    content = source.read_bytes()
    target = install_file(tools / source.name, content, 0o644)
    try:
        tag, code = _compiled(python, source.name, content)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        logger.warning("could not compile %s for %s: %s", source.name, python, exc)
        return target
    info = target.stat()
    header = b"".join(
        (
            code[:4],  # the interpreter's magic number
            (0).to_bytes(4, "little"),  # checked by the source's time and size
            (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little"),
            (info.st_size & 0xFFFFFFFF).to_bytes(4, "little"),
        )
    )
    cache = tools / "__pycache__"
    cache.mkdir(exist_ok=True)
    cache.chmod(0o755)
    install_file(cache / f"{target.stem}.{tag}.pyc", header + code[4:], 0o644)
    return target


@functools.cache
def _compiled(python: str, name: str, content: bytes) -> tuple[str, bytes]:
    """Compile `content` with `python`, once per process (each test, each sandbox root has
    its own tools folder): its cache tag, and its magic number followed by the marshalled
    code. Python sets the code's file name to the source's when it loads it."""
    compiled = subprocess.run(
        [python, "-I", "-S", "-c", COMPILE, name], input=content, capture_output=True, timeout=60
    )
    tag, _, code = compiled.stdout.partition(b"\n")
    if compiled.returncode or not tag or len(code) < 5:
        raise ValueError(compiled.stderr.decode(errors="replace").strip() or "no bytecode")
    return tag.decode(), code


# Run by the python that will run the tools: its cache tag, a newline, its magic number and
# the code of the source given on stdin.
COMPILE = (
    "import importlib.util, marshal, sys; "
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec', dont_inherit=True); "
    "sys.stdout.buffer.write(sys.implementation.cache_tag.encode() + b'\\n' "
    "+ importlib.util.MAGIC_NUMBER + marshal.dumps(code))"
)


def install_file(target: Path, content: bytes, mode: int) -> Path:
    """Write `target` with `content` and `mode`, atomically, unless it has them already."""
    try:
        if target.read_bytes() == content and stat.S_IMODE(target.stat().st_mode) == mode:
            return target
    except OSError:
        pass
    # Named for this call alone: another thread or process may be installing the same file.
    staging = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
    staging.write_bytes(content)
    staging.chmod(mode)
    os.replace(staging, target)
    return target
