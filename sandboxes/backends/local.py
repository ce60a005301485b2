"""The local backend: a sandbox is a folder on this machine, agents are subprocesses.

It needs nothing installed and is the embedded default. Every agent gets an explicit, minimal
environment (never the server's), and, when the server runs as root, a user of its own per
sandbox (`containment`), a view of the machine of its own (`jail`: its own PID namespace,
everything read-only but its sandbox, none of the machine's Unix sockets) and a network rule
that keeps it off this machine's own services (`firewall`). The README says exactly what is
and is not isolated.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast
from uuid import UUID

from django.conf import settings

from ..catalog import Launch, default_agent
from ..pipes import Lines, Outbox, pipes
from ..stderr_log import StderrLog
from ..workspace import Workspace
from . import containment, firewall, jail
from .base import Health, Progress, Resource, SandboxError

if TYPE_CHECKING:
    from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)


# Every agent process is started from this one long-lived thread. A jailed agent dies with the
# thread that started it (bubblewrap's --die-with-parent is PR_SET_PDEATHSIG, which the kernel
# fires when the starting *thread* ends), and the threads that ask for agents come and go.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="craft-agent-spawner")
# Where an agent's end of output is heard: it waits up to a second for the exit code.
_ends = ThreadPoolExecutor(max_workers=4, thread_name_prefix="craft-agent-ends")
# Where the workspace tool finds the session's checkpoint store, inside its jail (the one
# store mounted there).
STORE_IN_JAIL = "/tmp/craft-checkpoints"
# The workspace tool (listings, reads, checkpoints) is background work next to the live
# sessions: at this niceness a burst of new sessions' first checkpoints leaves the server's
# event loop most of the CPU (docs/performance.md).
TOOL_NICENESS = 10
# What may wait for an agent to read its stdin: a prompt is at most 100,000 characters, an
# answer to the agent's request a few hundred bytes. More means the agent stopped reading.
STDIN_WAITING_BYTES = 16 << 20


class LocalAgentProcess:
    """An agent running as a child process; its stderr goes to the log through a `StderrLog`.

    The backend always passes `env` (the agent's whole environment) and, with sandbox users,
    an argv that runs the agent in its jail as the sandbox's user (`jail.jailed`) and a umask
    of 077. Without `env` the child inherits this process's environment (tests only).
    """

    writes_block = False  # its stdin is an `Outbox`

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        *,
        env: dict[str, str] | None = None,
        umask: int = -1,
        redact: Iterable[str] = (),
    ) -> None:
        try:
            # A new session (process group) so that terminate() reaches the agent's children.
            self._popen = _spawner.submit(
                subprocess.Popen,
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                umask=umask,
                # Bigger than the default 8 KiB: fewer reads (and GIL hand-overs) per line
                # of a fast stream. readline still returns each line as soon as it arrives.
                bufsize=1 << 16,
            ).result()
        except OSError as exc:
            raise SandboxError(f"cannot start agent {argv[0]!r}: {exc}") from exc
        self.ident = str(self._popen.pid)
        self.pid = self._popen.pid
        self._stdin = Outbox(cast(IO[bytes], self._popen.stdin), STDIN_WAITING_BYTES, pipes)
        self._stderr = StderrLog(self.ident, redact=redact)
        pipes.watch(cast(IO[bytes], self._popen.stderr), self._stderr.feed, self._stderr.close)

    def write(self, data: bytes) -> None:
        self._stdin.write(data)

    def read_lines(
        self,
        limit: int,
        line: Callable[[bytes], None],
        too_long: Callable[[int], None],
        end: Callable[[], None],
    ) -> None:
        # Multi-megabyte lines are normal in ACP; `limit` keeps a runaway one out of memory.
        # The lines are cut on the pipes' thread; the end, which may wait for the exit code,
        # is heard on a thread of `_ends`.
        lines = Lines(limit, line, too_long)

        def ended() -> None:
            lines.end()
            _ends.submit(end)

        pipes.watch(cast(IO[bytes], self._popen.stdout), lines.feed, ended)

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def stderr_tail(self) -> str:
        return self._stderr.tail()

    def terminate(self, timeout: float = 5.0) -> None:
        """Close stdin (ACP agents exit on EOF), then SIGTERM, then SIGKILL the group."""
        self._stdin.close()
        try:
            self._popen.wait(timeout=min(1.0, timeout))
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGTERM)
            # A stopped (SIGSTOPped, hung in a debugger) agent only acts on SIGTERM once it runs.
            self._signal_group(signal.SIGCONT)
            try:
                self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._popen.wait()
        # The agent may have left children holding the pipes; the group is ours to clean.
        self._signal_group(signal.SIGKILL)
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                pipes.close(stream)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class LocalToolProcess:
    """The workspace tool as a child process (see `sandboxes.workspace.ToolProcess`)."""

    def __init__(self, argv: list[str]) -> None:
        env = {"LANG": "C.UTF-8", "PATH": containment.SYSTEM_PATH}
        try:
            # From the spawner thread, as agents are: a jailed tool dies with its thread.
            self._popen = _spawner.submit(
                subprocess.Popen,
                ["nice", "-n", str(TOOL_NICENESS), *argv],
                env=env,
                cwd="/",
                stdin=subprocess.PIPE,  # see `close_stdin`
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                bufsize=1 << 16,
            ).result()
        except OSError as exc:
            raise SandboxError(f"cannot read the workspace: {exc}") from exc
        self._stopped = False  # by Craft: its exit code then says nothing

    def readline(self, limit: int) -> bytes:
        assert self._popen.stdout is not None
        return self._popen.stdout.readline(limit)

    def read(self, size: int) -> bytes:
        stdout = cast(io.BufferedReader, self._popen.stdout)
        return stdout.read1(size)

    def finish(self, timeout: float) -> int | None:
        if self._popen.stdout is not None and self._popen.stdout.closed:
            return self._popen.returncode  # finished already
        try:
            code = self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            code = self._popen.returncode
        if code != 0 and not self._stopped and self._popen.stderr is not None:
            logger.warning(
                "the workspace tool exited %s: %s",
                code,
                self._popen.stderr.read(4096).decode(errors="replace").strip(),
            )
        self._close()
        return code

    def write(self, data: bytes) -> None:
        if self._popen.stdin is None or self._popen.stdin.closed:
            raise OSError("the tool's stdin is closed")
        self._popen.stdin.write(data)
        self._popen.stdin.flush()

    def close_stdin(self) -> None:
        if self._popen.stdin is not None:
            with contextlib.suppress(OSError):
                self._popen.stdin.close()

    def stop(self) -> None:
        """Kill the tool (from any thread: a reader blocked on its output gets the end)."""
        self._stopped = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        self._popen.wait()

    def _close(self) -> None:
        self.close_stdin()
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                stream.close()


def resolve_command(argv: list[str], path: str | None = None) -> list[str]:
    """Find argv[0] on `path`, by default this process's PATH and the folder of this Python
    (a virtualenv's bin is often not on PATH)."""
    if not argv:
        raise SandboxError("the agent's command is empty")
    program = argv[0]
    if os.sep in program:
        return argv
    if path is None:
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    found = shutil.which(program, path=path)
    if found is None:
        raise SandboxError(f"agent command {program!r} not found on the agents' PATH ({path})")
    return [found, *argv[1:]]


class LocalBackend:
    """Sandboxes as folders under `CRAFT_SANDBOX_ROOT`, agents as subprocesses.

    With sandbox users (`CRAFT_SANDBOX_UIDS`), a sandbox's folder, its `home`, `tmp` and
    session workspaces belong to the sandbox's own uid with mode 0700, and its agents run as
    that uid, in their jail, behind the network rule; when the jail or the rule cannot be put
    in place, sandboxes refuse to start and say why (`isolation_problem`).
    `<root>/.craft/bin` holds the bundled demo agent, first on every agent's PATH.
    """

    name = "local"

    def __init__(self) -> None:
        self.uids = containment.sandbox_uids_enabled(self.sandbox_root)
        starts = settings.CRAFT_LOCAL_AGENT_STARTS
        # Agents start on this machine's CPUs: 20 Python agents starting at once on 2 cores
        # delayed other sessions' events ~60 ms at p99; 2 at a time, ~20 ms (docs/performance.md).
        self.start_slots = threading.BoundedSemaphore(starts) if starts else None
        self._tools_lock = threading.Lock()
        self._tools_installed: set[Path] = set()
        self.isolation_problem = ""
        if self.uids:
            pool = self.pool
            last = pool.first + pool.count - 1
            logger.info(
                "local sandboxes run as users of their own (uids %d to %d)", pool.first, last
            )
            self.isolation_problem = self._isolate()

    def _isolate(self) -> str:
        """Check the jail's tools and put the network rule in place; return why not, or ""."""
        missing = jail.missing_tools()
        if missing:
            problem = (
                f"sandboxes need {' and '.join(missing)} installed to keep agents apart "
                f"(Debian: apt-get install {' '.join(missing)})"
            )
            logger.error("local sandboxes will not start: %s", problem)
            return problem
        if settings.CRAFT_SANDBOX_NETWORK == "open":
            logger.warning(
                "CRAFT_SANDBOX_NETWORK=open: agents can reach this machine's own services "
                "(its database, Redis, this server)"
            )
            return ""
        return self._install_network_rule()

    def _install_network_rule(self) -> str:
        pool = self.pool
        try:
            firewall.install(pool.first, pool.count, settings.CRAFT_SANDBOX_ALLOW)
        except SandboxError as exc:
            logger.error("local sandboxes will not start: %s", exc)
            return str(exc)
        return ""

    def check_isolation(self) -> None:
        """Put the network rule back if it went (someone flushed the machine's ruleset); the
        reaper calls this on every pass. Sandboxes refuse to start while it is not there."""
        if not self.uids or settings.CRAFT_SANDBOX_NETWORK == "open" or jail.missing_tools():
            return
        if firewall.is_installed(self.pool.first):
            return
        logger.error("the sandbox network rule is gone; putting it in place again")
        self.isolation_problem = self._install_network_rule()

    def _refuse_unisolated(self) -> None:
        if self.isolation_problem:
            raise SandboxError(self.isolation_problem)

    # The root is read from settings each time: provisioned sandboxes keep their folder (their
    # reference), new ones go wherever the setting says now.
    @property
    def sandbox_root(self) -> Path:
        return Path(settings.CRAFT_SANDBOX_ROOT)

    @property
    def pool(self) -> containment.UidPool:
        return containment.UidPool(self.sandbox_root)

    @property
    def tools(self) -> Path:
        return self.sandbox_root / containment.CRAFT_DIR / "bin"

    def _root(self, sandbox: Sandbox) -> Path:
        # Once provisioned, the reference is the folder: a later change of the root setting
        # must not orphan existing sandboxes.
        if sandbox.reference:
            return Path(sandbox.reference)
        return self.sandbox_root / str(sandbox.id)

    def _workspace(self, sandbox: Sandbox, session_id: UUID) -> Path:
        # session_id is a UUID, so the path cannot escape the sandbox folder.
        return self._root(sandbox) / "sessions" / str(UUID(str(session_id)))

    def _user(self, sandbox: Sandbox) -> containment.SandboxUser | None:
        return self.pool.assign(self._root(sandbox)) if self.uids else None

    def provision(self, sandbox: Sandbox, progress: Progress) -> str:
        self._refuse_unisolated()
        root = self._root(sandbox)
        progress("creating sandbox folder")
        try:
            if self.uids:
                containment.close_server_files(self.sandbox_root)
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            user = self._user(sandbox)
            for folder in ("sessions", "home", "tmp"):
                containment.private_folder(root, (folder,), user)
            root.chmod(0o700)
        except OSError as exc:
            raise SandboxError(f"cannot create sandbox folder: {exc}") from exc
        return str(root)

    def terminate(self, sandbox: Sandbox) -> None:
        root = self._root(sandbox)
        if self.uids:
            # Every process of the sandbox, on this machine, whichever server started it.
            with contextlib.suppress(OSError, SandboxError):
                containment.kill_user_processes(self.pool.user_of(root))
        # rmtree never follows links an agent may have planted (it works on folder fds).
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(self._stores_of(sandbox), ignore_errors=True)

    def _stores_root(self) -> Path:
        return self.sandbox_root / containment.CRAFT_DIR / "checkpoints"

    def _stores_of(self, sandbox: Sandbox) -> Path:
        return self._stores_root() / str(sandbox.id)

    def workspace_path(self, sandbox: Sandbox, session_id: UUID) -> str:
        return str(self._workspace(sandbox, session_id))

    def remove_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        parts = ("sessions", str(UUID(str(session_id))))
        containment.remove_private_folder(self._root(sandbox), parts)
        containment.remove_private_folder(self._stores_of(sandbox), (parts[1],))

    def warm_path(self, sandbox: Sandbox) -> str:
        # The sandbox's home: a folder of the sandbox that is no session's workspace.
        return str(self._root(sandbox) / "home")

    def make_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        user = self._user(sandbox)
        try:
            containment.private_folder(
                self._root(sandbox), ("sessions", self._workspace(sandbox, session_id).name), user
            )
        except OSError as exc:
            raise SandboxError(f"cannot create the session's workspace: {exc}") from exc

    def start_agent(
        self, sandbox: Sandbox, session_id: UUID, launch: Launch | None = None
    ) -> LocalAgentProcess:
        workspace = self._workspace(sandbox, session_id)
        return self._start(sandbox, ("sessions", workspace.name), launch)

    def start_warm_agent(self, sandbox: Sandbox, launch: Launch | None = None) -> LocalAgentProcess:
        return self._start(sandbox, ("home",), launch)

    def _start(
        self, sandbox: Sandbox, folder: tuple[str, ...], launch: Launch | None
    ) -> LocalAgentProcess:
        """Start the launch's agent in `folder` of the sandbox (created if need be)."""
        launch = launch or Launch(default_agent())
        self._refuse_unisolated()
        root = self._root(sandbox)
        cwd = root.joinpath(*folder)
        if not root.is_dir():
            raise SandboxError("the sandbox's folder does not exist")
        user = self._user(sandbox)
        if user is not None:
            containment.close_server_files(self.sandbox_root)
        tools = self.tools
        # The session's workspace is created here, at its agent's first start (a new session
        # touches nothing in the sandbox, which may still be provisioning). Checked without
        # following links, and created for sandboxes from before they existed. (Popen's chdir
        # into the workspace would follow a link swapped in after this check, but gives
        # nothing: the agent's rights on whatever it lands in are checked as its own.)
        try:
            for parts in dict.fromkeys((("home",), ("tmp",), folder)):
                containment.private_folder(root, parts, user)
        except OSError as exc:
            raise SandboxError(f"cannot create the session's workspace: {exc}") from exc
        self._install_tools()
        env = containment.agent_environment(root, tools, user, launch.agent.env)
        argv = resolve_command(list(launch.agent.command), env["PATH"])
        # Its owner's credentials, in its environment only (never argv: /proc/<pid>/cmdline
        # is readable by every process of the machine).
        env.update(launch.secrets)
        if user is not None and not containment.others_can_run(argv[0]):
            raise SandboxError(
                f"the agent command {argv[0]} cannot be run by sandbox users: install it where "
                "every user can run it (e.g. /usr/local/bin), or set CRAFT_SANDBOX_UIDS=off"
            )
        redact = list(launch.secrets.values())
        if user is None:
            return LocalAgentProcess(argv, cwd, env=env, redact=redact)
        argv = jail.jailed(
            argv,
            sandbox=root,
            workspace=cwd,
            user=user,
            sandbox_root=self.sandbox_root,
            tools=tools,
        )
        return LocalAgentProcess(argv, cwd, env=env, umask=0o077, redact=redact)

    def workspace(self, sandbox: Sandbox, session_id: UUID) -> Workspace:
        """Read the session's workspace with the workspace tool, run as the sandbox's user
        (when sandboxes have users), from the sandbox's folder down, following no link.

        Checkpoints go to a store in `.craft/checkpoints/<sandbox id>/<session id>`, a git
        repository of the sandbox's user behind a folder only root may enter: the tool writes
        it from a jail like its agents' in which it alone is mounted (no other session's
        store); agents never see it.
        """
        root = self._root(sandbox)
        session = str(UUID(str(session_id)))
        try:
            user = self.pool.user_of(root) if self.uids else None
        except OSError as exc:
            raise SandboxError("the sandbox's folder is gone") from exc
        self._install_tools()
        stores = self._checkpoint_stores(sandbox, user)
        command = [
            *containment.module_command(
                containment.sandbox_python(self.uids), self.tools, "workspace_tool"
            ),
            str(root),
            f"sessions/{session}",
        ]
        if user is None:
            run = lambda args: LocalToolProcess([*command, *args])  # noqa: E731
            return Workspace(run, run, str(stores / session), waits=True)
        jailed = jail.jailed(
            command,
            sandbox=root,
            workspace=root,
            user=user,
            sandbox_root=self.sandbox_root,
            tools=self.tools,
            binds=((stores / session, STORE_IN_JAIL),),
        )

        def run_in_store(args: list[str]) -> LocalToolProcess:
            # Made here, not by the tool: only an existing folder can be mounted.
            try:
                containment.private_folder(stores, (session,), user)
            except OSError as exc:
                raise SandboxError(f"cannot create the session's checkpoint store: {exc}") from exc
            return LocalToolProcess([*jailed, *args])

        return Workspace(
            lambda args: LocalToolProcess([*containment.as_user(user), *command, *args]),
            run_in_store,
            STORE_IN_JAIL,
            waits=True,
        )

    def _checkpoint_stores(self, sandbox: Sandbox, user: containment.SandboxUser | None) -> Path:
        """Return the folder of the sandbox's checkpoint stores, creating it (the sandbox's
        user's, 0700, in a folder of root's that no sandbox user may enter)."""
        stores = self._stores_root()
        stores.mkdir(mode=0o700, parents=True, exist_ok=True)
        stores.chmod(0o700)
        containment.private_folder(stores, (str(sandbox.id),), user)
        return stores / str(sandbox.id)

    def _install_tools(self) -> None:
        tools = self.tools
        with self._tools_lock:
            if tools not in self._tools_installed:
                python = containment.sandbox_python(self.uids)
                containment.install_demo_agent(tools, python)
                containment.install_workspace_tool(tools, python)
                self._tools_installed.add(tools)

    def health(self, sandbox: Sandbox) -> Health:
        root = self._root(sandbox)
        if not root.is_dir():
            return Health(False, "the sandbox's folder is gone", gone=True)
        if self.uids:
            try:
                user = self.pool.user_of(root)
            except SandboxError as exc:
                return Health(False, str(exc))
            return Health(True, f"folder present, runs as uid {user.uid}")
        return Health(True, "folder present")

    def inventory(self) -> list[Resource]:
        """Return the sandbox folders under the current root (named by sandbox id), and the
        folders of their checkpoint stores (kind "checkpoints").

        Folders of sandboxes provisioned under an earlier root are not seen.
        """
        return [
            *self._folders_named_by_sandbox(self.sandbox_root, "folder"),
            *self._folders_named_by_sandbox(self._stores_root(), "checkpoints"),
        ]

    @staticmethod
    def _folders_named_by_sandbox(parent: Path, kind: str) -> list[Resource]:
        try:
            entries = list(parent.iterdir())
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SandboxError(f"cannot list {parent}: {exc.strerror}") from exc
        found = []
        for entry in entries:
            try:
                sandbox_id = UUID(entry.name)
            except ValueError:
                continue  # .craft (the server's own files) and anything else not ours
            if entry.is_dir() and not entry.is_symlink():
                found.append(Resource(sandbox_id, kind, str(entry)))
        return found

    def remove(self, resource: Resource) -> None:
        folder = Path(resource.name)
        parent = self._stores_root() if resource.kind == "checkpoints" else self.sandbox_root
        if folder.parent != parent or folder.name != str(resource.sandbox_id):
            raise SandboxError(f"{folder} is not a sandbox folder of this server")
        # rmtree never follows links an agent may have planted (it works on folder fds).
        shutil.rmtree(folder, ignore_errors=True)
