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
import fcntl
import io
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast
from uuid import UUID

from django.conf import settings

from ..catalog import Launch, default_agent
from ..pipes import Lines, Outbox, pipes
from ..repository import Repository
from ..stderr_log import StderrLog
from ..workspace import Workspace
from . import budget, containment, firewall, jail, network, ports
from .base import Health, Progress, Resource, SandboxError

if TYPE_CHECKING:
    from sandboxes.models import Sandbox

    from ..agent.process import LineReader

logger = logging.getLogger(__name__)


# Every agent process is started from this one long-lived thread. A jailed agent dies with the
# thread that started it (bubblewrap's --die-with-parent is PR_SET_PDEATHSIG, which the kernel
# fires when the starting *thread* ends), and the threads that ask for agents come and go.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="craft-agent-spawner")


# Signals a server started in the background of a script runs with ignored (a shell does that
# for its background jobs), and that every process it starts would inherit: ^C would do
# nothing in a terminal, nor SIGQUIT to a sandbox's programs. coreutils' env puts them back
# to their default before it runs the command (a preexec_fn could too, but is not safe in a
# process with threads).
_SANDBOX_SIGNALS = (signal.SIGINT, signal.SIGQUIT)
_DEFAULT_SIGNALS = [
    shutil.which("env") or "/usr/bin/env",
    "--default-signal=" + ",".join(number.name.removeprefix("SIG") for number in _SANDBOX_SIGNALS),
]


def _spawn(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start `argv` (on the spawner thread), handing a jailed one its seccomp filter, with
    the default action for `_SANDBOX_SIGNALS` if this server ignores one of them."""
    if any(signal.getsignal(number) == signal.SIG_IGN for number in _SANDBOX_SIGNALS):
        argv = [*_DEFAULT_SIGNALS, *argv]
    with jail.passing_filter(argv) as (argv, fds):
        return subprocess.Popen(argv, pass_fds=fds, **options)


def _start(
    argv: list[str],
    *,
    cwd: Path | str,
    env: dict[str, str] | None,
    stderr: int,
    umask: int,
    leaf: budget.Leaf | None,
    failure: str,
) -> subprocess.Popen[bytes]:
    """Start `argv` from the spawner thread in a session of its own (a process group, so that
    terminating it reaches its children), its stdin and stdout piped; if it cannot start,
    close its cgroup `leaf` and raise SandboxError saying `failure` and why."""
    try:
        return _spawner.submit(
            _spawn,
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
            umask=umask,
            # Bigger than the default 8 KiB: fewer reads (and GIL hand-overs) per line of a
            # fast stream. readline still returns each line as soon as it arrives.
            bufsize=1 << 16,
        ).result()
    except OSError as exc:
        if leaf is not None:
            leaf.close()
        raise SandboxError(f"{failure}: {exc}") from exc


# Where an agent's end of output is heard: it waits up to a second for the exit code.
_ends = ThreadPoolExecutor(max_workers=4, thread_name_prefix="craft-agent-ends")
# Where the workspace tool finds the session's checkpoint store, inside its jail (the one
# store mounted there).
STORE_IN_JAIL = "/tmp/craft-checkpoints"
# Where Craft's git finds the session's git store (`sandboxes.repository`), inside its jail.
GIT_STORE_IN_JAIL = "/tmp/craft-git"
# The workspace tool (listings, reads, checkpoints) is background work next to the live
# sessions: at this niceness a burst of new sessions' first checkpoints leaves the server's
# event loop most of the CPU (docs/history/performance-diary.md, "The latest run, and the
# workspace"). A fork's start is not niced.
TOOL_NICENESS = 10
# What may wait for an agent to read its stdin: a prompt is at most 100,000 characters, an
# answer to the agent's request a few hundred bytes. More means the agent stopped reading.
STDIN_WAITING_BYTES = 16 << 20
# What may wait for a terminal's shell to read its input (a paste): past it, the write fails.
TERMINAL_INPUT_BYTES = 1 << 20
# One read of a terminal's output takes what it holds, up to this.
TERMINAL_READ_BYTES = 1 << 16
# How often, at most, an agent's output makes Craft look whether the kernel killed one of
# its processes for want of memory (one small read of its cgroup).
MEMORY_WATCH_SECONDS = 1.0
# The longest a measure of a sandbox's disk use may take (the reaper waits for it).
DISK_MEASURE_SECONDS = 120.0


class LocalAgentProcess:
    """An agent running as a child process; its stderr goes to the log through a `StderrLog`.

    The backend always passes `env` (the agent's whole environment) and, with sandbox users,
    an argv that runs the agent in its jail as the sandbox's user (`jail.jailed`) and a umask
    of 077, and with a budget the cgroup `leaf` the argv enters first (killed and removed with
    the agent). Without `env` the child inherits this process's environment (tests only).
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
        leaf: budget.Leaf | None = None,
    ) -> None:
        self._leaf = leaf
        self._memory_kills = 0  # of its processes, as last seen
        self._memory_seen_at = 0.0
        self._popen = _start(
            argv,
            cwd=cwd,
            env=env,
            stderr=subprocess.PIPE,
            umask=umask,
            leaf=leaf,
            failure=f"cannot start agent {argv[0]!r}",
        )
        self.ident = str(self._popen.pid)
        self.pid = self._popen.pid
        self._stdin = Outbox(cast(IO[bytes], self._popen.stdin), STDIN_WAITING_BYTES, pipes)
        self._stderr = StderrLog(self.ident, redact=redact)
        pipes.watch(cast(IO[bytes], self._popen.stderr), self._stderr.feed, self._stderr.close)

    def write(self, data: bytes) -> None:
        self._stdin.write(data)

    def read_lines(self, reader: LineReader) -> None:
        # Multi-megabyte lines are normal in ACP; the limit keeps a runaway one out of memory.
        # The lines are cut on the pipes' thread; the end, which may wait for the exit code,
        # is heard on a thread of `_ends`.
        line = reader.line if self._leaf is None else self._watching_memory(reader.line)
        lines = Lines(reader.limit, line, reader.too_long)

        def ended() -> None:
            lines.end()
            _ends.submit(reader.end)

        pipes.watch(cast(IO[bytes], self._popen.stdout), lines.feed, ended)

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def stderr_tail(self) -> str:
        return self._stderr.tail()

    def end_reason(self) -> str | None:
        """Return "the agent ran out of memory (limit ...)" when the kernel killed it (or the
        jail around it) for want of memory in its sandbox's budget; else None."""
        # 137: the jail's answer when what it runs was killed by SIGKILL (128 + 9).
        if self._leaf is None or self.exit_code() not in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return None
        if not self._leaf.oom_kills():
            return None
        return out_of_memory(self._leaf.budget.limits.memory)

    def _watching_memory(self, line: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """Wrap `line` so that the agent's output, at most every MEMORY_WATCH_SECONDS, logs
        the processes of the agent the kernel killed for want of memory while it lives on."""

        def watched(data: bytes) -> None:
            now = time.monotonic()
            if now - self._memory_seen_at >= MEMORY_WATCH_SECONDS:
                self._memory_seen_at = now
                self._log_memory_kills()
            line(data)

        return watched

    def _log_memory_kills(self) -> None:
        if self._leaf is None:
            return
        kills = self._leaf.oom_kills()
        if kills <= self._memory_kills:
            return
        if (reason := self.end_reason()) is not None:
            logger.warning("agent %s: %s", self.ident, reason)
        else:
            memory = self._leaf.budget.limits.memory
            limit = budget.format_size(memory) if memory else "none"
            logger.warning(
                "agent %s: the kernel killed %d of its processes for want of memory "
                "(its sandbox's limit is %s)",
                self.ident, kills - self._memory_kills, limit,
            )  # fmt: skip
        self._memory_kills = kills

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
        if self._leaf is not None:
            # And whatever else it started, however it forked: its cgroup goes as one.
            self._log_memory_kills()
            self._leaf.close()
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                pipes.close(stream)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class LocalToolProcess:
    """The workspace tool as a child process (see `sandboxes.workspace.ToolProcess`).

    Also a repository's set-up (`setup`): run as an agent is (not niced, in the agent's
    environment `env`, in `cwd`), its stderr in its stdout, and its cgroup `leaf` (if any)
    killed and removed with it. A `waited_for` run (a fork's start, which its person waits
    for, one at a time per session) is not niced either.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        setup: bool = False,
        env: dict[str, str] | None = None,
        cwd: Path | str = "/",
        leaf: budget.Leaf | None = None,
        waited_for: bool = False,
    ) -> None:
        if env is None:
            env = {"LANG": "C.UTF-8", "PATH": containment.SYSTEM_PATH}
        self._leaf = leaf
        # From the spawner thread, as agents are: a jailed tool dies with its thread. Its
        # stdin is a pipe: see `close_stdin`.
        self._popen = _start(
            argv if setup or waited_for else ["nice", "-n", str(TOOL_NICENESS), *argv],
            cwd=cwd,
            env=env,
            stderr=subprocess.STDOUT if setup else subprocess.PIPE,
            umask=0o077 if setup else -1,
            leaf=leaf,
            failure="cannot run in the sandbox",
        )
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
        self._close_leaf()  # and whatever it started, however it forked
        self._popen.wait()

    def _close(self) -> None:
        self.close_stdin()
        self._close_leaf()
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                stream.close()

    def _close_leaf(self) -> None:
        leaf, self._leaf = self._leaf, None
        if leaf is not None:
            leaf.close()


class LocalTerminal:
    """A shell on a pseudo-terminal of this machine (`SandboxBackend.start_terminal`).

    `argv` makes the terminal the shell's controlling one (`setsid -w -c`, inside the jail
    when there is one); its master side is read by a thread of its own and written through
    an `Outbox` (the agents' pipes thread), so that nothing here blocks the event loop. With
    a budget, the cgroup `leaf` the argv enters first is killed and removed with the terminal.
    """

    writes_block = False

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        cols: int,
        rows: int,
        *,
        umask: int = -1,
        leaf: budget.Leaf | None = None,
    ) -> None:
        self._leaf = leaf
        self._closed = False
        master, slave = os.openpty()
        try:
            _set_size(master, cols, rows)
            # From the spawner thread, as agents are: a jailed shell dies with its thread.
            self._popen = _spawner.submit(
                _spawn,
                argv,
                cwd=cwd,
                env=env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                umask=umask,
            ).result()
        except OSError as exc:
            os.close(master)
            if leaf is not None:
                leaf.close()
            raise SandboxError(f"cannot start a terminal: {exc}") from exc
        finally:
            os.close(slave)
        self.ident = str(self._popen.pid)
        self._master = master
        self._input = Outbox(
            os.fdopen(os.dup(master), "wb", buffering=0), TERMINAL_INPUT_BYTES, pipes
        )

    def listen(self, output: Callable[[bytes], None], end: Callable[[], None]) -> None:
        # A thread of its own, not the agents' pipes thread: the terminal waits for slow
        # sockets (flow control), and no agent's output may wait with it.
        reader = threading.Thread(
            target=self._read, args=(output, end), name=f"terminal-{self.ident}", daemon=True
        )
        reader.start()

    def _read(self, output: Callable[[bytes], None], end: Callable[[], None]) -> None:
        """Read the master side until no process holds the terminal (a read fails with EIO)
        or it is terminated; then close it and call `end`."""
        # The descriptor is non-blocking (shared with the Outbox's): wait for it (poll, not
        # select: a busy server's descriptors run past select's 1024).
        waiting = select.poll()
        waiting.register(self._master, select.POLLIN)
        try:
            while not self._closed:
                if not waiting.poll(1000):
                    continue
                try:
                    chunk = os.read(self._master, TERMINAL_READ_BYTES)
                except BlockingIOError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                output(chunk)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._master)
            end()

    def write(self, data: bytes) -> None:
        self._input.write(data)

    def resize(self, cols: int, rows: int) -> None:
        if not self._closed:
            with contextlib.suppress(OSError):
                _set_size(self._master, cols, rows)

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self) -> None:
        """Hang up (SIGHUP to the group), then SIGKILL what is left: the jail, its PID
        namespace and, with a budget, everything in the terminal's cgroup."""
        if self._closed:
            return
        self._closed = True
        # Once the shell is reaped its pid may be another's: its group is signalled only
        # while it runs (the jail's PID namespace and the cgroup end the rest).
        if self._popen.poll() is None:
            self._signal_group(signal.SIGHUP)
            self._signal_group(signal.SIGCONT)
            try:
                self._popen.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._popen.wait()
        leaf, self._leaf = self._leaf, None
        if leaf is not None:
            leaf.close()
        self._input.close()  # the reader closes the master side within a second

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def terminal_shell(path: str) -> str:
    """Return the shell a terminal runs: bash if `path` has it, else sh."""
    return shutil.which("bash", path=path) or shutil.which("sh", path=path) or "/bin/sh"


def out_of_memory(limit: int) -> str:
    """Return what a turn says of an agent the kernel killed for want of memory."""
    if not limit:
        return "the agent ran out of memory (this machine's)"
    return f"the agent ran out of memory (limit {budget.format_size(limit)})"


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
    that uid, in their jail, behind the network rule, within the sandbox's budget (`budget`,
    cgroups); when the jail, the budget or the rule cannot be put in place, sandboxes refuse
    to start and say why (`isolation_problem`).
    `<root>/.craft/bin` holds the bundled demo agent, first on every agent's PATH.
    """

    name = "local"

    def __init__(self) -> None:
        self.uids = containment.sandbox_uids_enabled(self.sandbox_root)
        starts = settings.CRAFT_LOCAL_AGENT_STARTS
        # Agents start on this machine's CPUs: 20 Python agents starting at once on 2 cores
        # delayed other sessions' events ~60 ms at p99; 2 at a time, ~20 ms
        # (docs/history/performance-diary.md, "Where the time went, and what changed").
        self.start_slots = threading.BoundedSemaphore(starts) if starts else None
        self._tools_lock = threading.Lock()
        self._tools_installed: set[Path] = set()
        self.isolation_problem = ""
        self.budget: budget.Budget | None = None
        if self.uids:
            pool = self.pool
            last = pool.first + pool.count - 1
            logger.info(
                "local sandboxes run as users of their own (uids %d to %d)", pool.first, last
            )
            self.isolation_problem = self._isolate()

    def _isolate(self) -> str:
        """Check the sandbox root and the jail's tools and put the network rule in place;
        return why sandboxes cannot be isolated, or ""."""
        problem = containment.sandbox_root_problem(self.sandbox_root)
        if problem:
            logger.error("local sandboxes will not start: %s", problem)
            return problem
        missing = jail.missing_tools()
        if settings.CRAFT_SANDBOX_NETWORK == "isolated":
            missing += [tool for tool in network.missing_tools() if tool not in missing]
        if missing:
            problem = (
                f"sandboxes need {' and '.join(missing)} installed to keep agents apart "
                f"(Debian: apt-get install {' '.join(missing)})"
            )
            logger.error("local sandboxes will not start: %s", problem)
            return problem
        problem = self._make_budget()
        if problem:
            return problem
        if settings.CRAFT_SANDBOX_NETWORK == "open":
            logger.warning(
                "CRAFT_SANDBOX_NETWORK=open: agents share this machine's network and can reach "
                "its own services (its database, Redis, this server)"
            )
            return ""
        return self._install_network_rule()

    def _make_budget(self) -> str:
        """Set up the cgroups that hold each sandbox's budget; return why not, or ""."""
        if settings.CRAFT_SANDBOX_LIMITS == "off":
            logger.warning(
                "CRAFT_SANDBOX_LIMITS=off: sandboxes run without a memory, CPU or process "
                "budget; one can take this machine's memory and CPU from every other"
            )
            return ""
        limits = budget.Limits(
            memory=settings.CRAFT_SANDBOX_MEMORY,
            cpu=settings.CRAFT_SANDBOX_CPU,
            pids=settings.CRAFT_SANDBOX_PIDS,
        )
        try:
            self.budget = budget.Budget(budget.detect(), self.pool.first, limits)
        except SandboxError as exc:
            problem = (
                f"sandboxes need cgroups for their memory, CPU and process budget: {exc}. "
                "Set CRAFT_SANDBOX_LIMITS=off to run them without one"
            )
            logger.error("local sandboxes will not start: %s", problem)
            return problem
        logger.info(
            "each sandbox's budget: memory %s, CPU %s, processes %s (%s)",
            budget.format_size(limits.memory) if limits.memory else "unlimited",
            f"{limits.cpu:g} cores" if limits.cpu else "unlimited",
            limits.pids or "unlimited",
            self.budget.describe(),
        )
        return ""

    def _install_network_rule(self) -> str:
        pool = self.pool
        try:
            firewall.install(pool.first, pool.count, settings.CRAFT_SANDBOX_ALLOW)
        except SandboxError as exc:
            logger.error("local sandboxes will not start: %s", exc)
            return str(exc)
        return ""

    def check_isolation(self) -> None:
        """Put the network rule back if it went (someone flushed the machine's ruleset), and
        start again the pasta of a sandbox network whose pasta died; the reaper calls this
        on every pass. Sandboxes refuse to start while the rule is not there."""
        if not self._isolated_network() or jail.missing_tools():
            return
        if not firewall.is_installed(self.pool.first):
            logger.error("the sandbox network rule is gone; putting it in place again")
            self.isolation_problem = self._install_network_rule()
        allow = settings.CRAFT_SANDBOX_ALLOW
        for sandbox_id in network.sandbox_ids(self.pool.first):
            folder = self.sandbox_root / str(sandbox_id)
            if not folder.is_dir():
                continue  # an orphan: the sweep removes it
            try:
                user = self.pool.user_of(folder)
                if not network.is_up(self.pool.first, sandbox_id, user, allow):
                    logger.warning("starting the network of sandbox %s again", sandbox_id)
                    self._network(sandbox_id, user)
            except (OSError, SandboxError) as exc:
                logger.error("cannot start the network of sandbox %s again: %s", sandbox_id, exc)

    def _isolated_network(self) -> bool:
        return self.uids and settings.CRAFT_SANDBOX_NETWORK == "isolated"

    def _network(self, sandbox_id: UUID, user: containment.SandboxUser) -> Path:
        """Return the sandbox's network namespace, made (or its pasta started, within the
        sandbox's budget) if need be."""
        within: Callable[[list[str]], list[str]] = list
        if self.budget is not None:
            within = self.budget.network_leaf(sandbox_id).command
        allow = settings.CRAFT_SANDBOX_ALLOW
        return network.ensure(self.pool.first, sandbox_id, user, allow, within)

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
        if user is not None and self._isolated_network():
            progress("setting up the sandbox's network")
            self._network(sandbox.pk, user)
        return str(root)

    def terminate(self, sandbox: Sandbox) -> None:
        root = self._root(sandbox)
        self.sleep(sandbox)
        # rmtree never follows links an agent may have planted (it works on folder fds).
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(self._stores_of(sandbox), ignore_errors=True)
        shutil.rmtree(self._git_stores_of(sandbox), ignore_errors=True)

    def sleep(self, sandbox: Sandbox) -> None:
        """Kill the sandbox's processes and remove its network; its folder stays (a sleeping
        folder costs nothing, and `provision` sets the network up again)."""
        if self.budget is not None:
            self._kill_budget(sandbox.pk)
        if self.uids:
            # Every process of the sandbox, on this machine, whichever server started it
            # (its network's pasta included), then its network namespace.
            with contextlib.suppress(OSError, SandboxError):
                containment.kill_user_processes(self.pool.user_of(self._root(sandbox)))
            network.remove(self.pool.first, sandbox.pk)

    def _kill_budget(self, sandbox_id: UUID) -> None:
        """Kill the sandbox's processes as one (its cgroup) and remove its cgroups; what
        fails is logged, and the reaper removes the cgroup of a terminated sandbox later."""
        assert self.budget is not None
        try:
            self.budget.kill_sandbox(sandbox_id)
        except SandboxError as exc:
            logger.warning("sandbox %s: %s", sandbox_id, exc)

    def _stores_root(self) -> Path:
        return self.sandbox_root / containment.CRAFT_DIR / "checkpoints"

    def _stores_of(self, sandbox: Sandbox) -> Path:
        return self._stores_root() / str(sandbox.id)

    def _git_stores_root(self) -> Path:
        return self.sandbox_root / containment.CRAFT_DIR / "git"

    def _git_stores_of(self, sandbox: Sandbox) -> Path:
        return self._git_stores_root() / str(sandbox.id)

    def workspace_path(self, sandbox: Sandbox, session_id: UUID) -> str:
        return str(self._workspace(sandbox, session_id))

    def remove_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        parts = ("sessions", str(UUID(str(session_id))))
        containment.remove_private_folder(self._root(sandbox), parts)
        containment.remove_private_folder(self._stores_of(sandbox), (parts[1],))
        containment.remove_private_folder(self._git_stores_of(sandbox), (parts[1],))

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
        argv = self._agent_jail(sandbox, argv, root, cwd, user)
        leaf = self.budget.agent_leaf(sandbox.pk) if self.budget is not None else None
        if leaf is not None:
            argv = leaf.command(argv)
        return LocalAgentProcess(argv, cwd, env=env, umask=0o077, redact=redact, leaf=leaf)

    def start_terminal(
        self, sandbox: Sandbox, session_id: UUID, cols: int, rows: int
    ) -> LocalTerminal:
        """Start a shell on a terminal in the session's workspace as `run_setup` runs a
        repository's set-up: the agent's jail, network and budget, as the sandbox's user, in
        the agent's environment without its owner's credentials."""
        self._refuse_unisolated()
        root = self._root(sandbox)
        cwd = self._workspace(sandbox, session_id)
        if not root.is_dir():
            raise SandboxError("the sandbox's folder does not exist")
        user = self._user(sandbox)
        if user is not None:
            containment.close_server_files(self.sandbox_root)
        try:
            for parts in (("home",), ("tmp",), ("sessions", cwd.name)):
                containment.private_folder(root, parts, user)
        except OSError as exc:
            raise SandboxError(f"cannot create the session's workspace: {exc}") from exc
        self._install_tools()
        env = containment.agent_environment(root, self.tools, user)
        shell = terminal_shell(containment.SYSTEM_PATH)
        env.update(TERM="xterm-256color", SHELL=shell)
        setsid = shutil.which("setsid", path=containment.SYSTEM_PATH) or "setsid"
        # bubblewrap's --new-session leaves the shell without a controlling terminal (and a
        # process group leader, so setsid forks: -w waits and passes the exit code on).
        argv = [setsid, "-w", "-c", shell]
        if user is None:
            return LocalTerminal(argv, cwd, env, cols, rows)
        argv = self._agent_jail(sandbox, argv, root, cwd, user)
        leaf = self.budget.agent_leaf(sandbox.pk) if self.budget is not None else None
        if leaf is not None:
            argv = leaf.command(argv)
        return LocalTerminal(argv, cwd, env, cols, rows, umask=0o077, leaf=leaf)

    def _agent_jail(
        self,
        sandbox: Sandbox,
        argv: list[str],
        root: Path,
        cwd: Path,
        user: containment.SandboxUser,
        **options: Any,
    ) -> list[str]:
        """Return `argv` in a jail as the sandbox's agents have, in `cwd`, on the sandbox's
        network (its own with `CRAFT_SANDBOX_NETWORK=isolated`); `options` go to the jail."""
        isolated = self._isolated_network()
        return self._jailed(
            argv,
            root,
            cwd,
            user,
            network=self._network(sandbox.pk, user) if isolated else None,
            resolv_conf=network.resolv_conf(self.pool.first) if isolated else None,
            **options,
        )

    def _jailed(
        self, argv: list[str], root: Path, cwd: Path, user: containment.SandboxUser, **options: Any
    ) -> list[str]:
        """Return `argv` in a jail of the sandbox whose folder is `root`, in `cwd`, as `user`,
        with this backend's tools and (without a budget) the user's process limit; `options`
        go to the jail."""
        return jail.jailed(
            argv,
            sandbox=root,
            workspace=cwd,
            user=user,
            sandbox_root=self.sandbox_root,
            tools=self.tools,
            uid_nproc=self.budget is None,
            **options,
        )

    def repository(self, sandbox: Sandbox, session_id: UUID) -> Repository:
        """Return the session's workspace as a git repository (`sandboxes.repository`).

        Its store is `.craft/git/<sandbox id>/<session id>`, a bare repository of the
        sandbox's user behind a folder only root may enter, as the checkpoint stores are:
        Craft's git mounts it (at GIT_STORE_IN_JAIL) in jails of its own, and agents never
        see it. Remote steps run in a jail on the sandbox's network in which the sandbox's
        folder is read-only; the others in one with no network.
        """
        self._refuse_unisolated()
        root, session, user = self._session_tools(sandbox, session_id)
        return Repository(LocalGitRunner(self, sandbox, root, session, user))

    def _session_tools(
        self, sandbox: Sandbox, session_id: UUID
    ) -> tuple[Path, str, containment.SandboxUser | None]:
        """Return the sandbox's folder, the session's id as text and the sandbox's user (None
        without sandbox users), with Craft's tools installed, for Craft's own work on the
        session's files; raise SandboxError when the folder is gone."""
        root = self._root(sandbox)
        session = str(UUID(str(session_id)))
        try:
            user = self.pool.user_of(root) if self.uids else None
        except OSError as exc:
            raise SandboxError("the sandbox's folder is gone") from exc
        self._install_tools()
        return root, session, user

    def workspace(self, sandbox: Sandbox, session_id: UUID) -> Workspace:
        """Read the session's workspace with the workspace tool, run as the sandbox's user
        (when sandboxes have users), from the sandbox's folder down, following no link.

        Checkpoints go to a store in `.craft/checkpoints/<sandbox id>/<session id>`, a git
        repository of the sandbox's user behind a folder only root may enter: the tool writes
        it from a jail like its agents' in which it alone is mounted (no other session's
        store); agents never see it.
        """
        root, session, user = self._session_tools(sandbox, session_id)
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
            forks = lambda args: LocalToolProcess([*command, *args], waited_for=True)  # noqa: E731
            return Workspace(
                run, run, str(stores / session), waits=True, run_in_stores=forks,
                stores=str(stores), session=session,
            )  # fmt: skip
        jailed = self._tool_jail(command, root, user, stores / session)
        within = self._tool_budget(sandbox)

        def run_in_store(args: list[str]) -> LocalToolProcess:
            # Made here, not by the tool: only an existing folder can be mounted.
            try:
                containment.private_folder(stores, (session,), user)
            except OSError as exc:
                raise SandboxError(f"cannot create the session's checkpoint store: {exc}") from exc
            return LocalToolProcess(within([*jailed, *args]))

        def run_in_stores(args: list[str]) -> LocalToolProcess:
            # A fork: the sandbox's stores, all mounted in one place, so that the new store's
            # objects can be hard links of the source's (no link crosses two mounts). Not
            # niced: its person waits for it, and on a busy machine a niced fork took
            # 1.5 times as long (docs/history/performance-diary.md, "A fork of a big session").
            try:
                containment.private_folder(stores, (session,), user)
            except OSError as exc:
                raise SandboxError(f"cannot create the session's checkpoint store: {exc}") from exc
            jailed_in_stores = self._tool_jail(command, root, user, stores)
            return LocalToolProcess(within([*jailed_in_stores, *args]), waited_for=True)

        return Workspace(
            lambda args: LocalToolProcess(within([*containment.as_user(user), *command, *args])),
            run_in_store,
            STORE_IN_JAIL,
            waits=True,
            run_in_stores=run_in_stores,
            stores=STORE_IN_JAIL,
            session=session,
        )

    def _tool_jail(
        self,
        argv: list[str],
        root: Path,
        user: containment.SandboxUser,
        store: Path,
        read_only_binds: tuple[tuple[Path, str], ...] = (),
    ) -> list[str]:
        """Return `argv` (Craft's own work on a sandbox's files) in a jail like its agents',
        in the sandbox's folder, with no network, `store` (one session's checkpoint store,
        or the folder of all the sandbox's) mounted at STORE_IN_JAIL, and `read_only_binds`
        mounted where each names."""
        return self._jailed(
            argv,
            root,
            root,
            user,
            no_network=True,
            binds=((store, STORE_IN_JAIL),),
            read_only_binds=read_only_binds,
        )

    def _tool_budget(self, sandbox: Sandbox) -> Callable[[list[str]], list[str]]:
        """Return what puts a run of Craft's workspace tool (or its `du`) in the sandbox's
        budget: the argv that enters the tool's cgroup first (as it is, without a budget)."""
        if self.budget is None:
            return lambda argv: argv
        return self.budget.tool_leaf(sandbox.pk).command

    def disk_usage(self, sandbox: Sandbox) -> int | None:
        """Return the bytes the sandbox's folder and its checkpoint stores take on disk, as
        `du` sees them run as the sandbox's user (in a jail like the tool's, within its
        budget); None when it could not be measured. Folders the sandbox made unreadable
        to its own user are not counted."""
        root = self._root(sandbox)
        if not root.is_dir():
            return None
        du = shutil.which("du", path=containment.SYSTEM_PATH) or "du"
        try:
            user = self.pool.user_of(root) if self.uids else None
            stores = self._checkpoint_stores(sandbox, user)
        except (OSError, SandboxError) as exc:
            logger.warning("cannot measure sandbox %s: %s", sandbox.pk, exc)
            return None
        git_stores = self._git_stores_of(sandbox)
        counted = [git_stores] if git_stores.is_dir() else []
        if user is None:
            argv = [du, "-s", "-B1", "--", str(root), str(stores), *map(str, counted)]
        else:
            du_argv = [du, "-s", "-B1", "--", str(root), STORE_IN_JAIL]
            du_argv += [GIT_STORE_IN_JAIL] if counted else []
            # All its sessions' stores, mounted for their size.
            read_only = tuple((folder, GIT_STORE_IN_JAIL) for folder in counted)
            jailed = self._tool_jail(du_argv, root, user, stores, read_only)
            argv = self._tool_budget(sandbox)(jailed)
        return _measure(argv, str(sandbox.pk))

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
                containment.install_git_tool(tools, python)
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
        """Return the sandbox folders under the current root (named by sandbox id), the
        folders of their checkpoint stores (kind "checkpoints") and git stores ("git"), and
        their cgroups ("cgroup").

        Folders of sandboxes provisioned under an earlier root are not seen.
        """
        networks = [
            Resource(sandbox_id, "network", network.name(self.pool.first, sandbox_id))
            for sandbox_id in network.sandbox_ids(self.pool.first)
        ]
        cgroups = []
        if self.budget is not None:
            cgroups = [
                Resource(sandbox_id, "cgroup", f"{self.budget.installation}/{sandbox_id}")
                for sandbox_id in self.budget.sandboxes()
            ]
        return [
            *self._folders_named_by_sandbox(self.sandbox_root, "folder"),
            *self._folders_named_by_sandbox(self._stores_root(), "checkpoints"),
            *self._folders_named_by_sandbox(self._git_stores_root(), "git"),
            *networks,
            *cgroups,
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
        if resource.kind == "network":
            # Its pasta runs as the sandbox's uid, which may be handed out again once nothing
            # runs as it: stopped with the namespace.
            network.remove(self.pool.first, resource.sandbox_id)
            return
        if resource.kind == "cgroup":
            if self.budget is not None:
                self.budget.kill_sandbox(resource.sandbox_id)
            return
        folder = Path(resource.name)
        parent = {"checkpoints": self._stores_root(), "git": self._git_stores_root()}.get(
            resource.kind, self.sandbox_root
        )
        if folder.parent != parent or folder.name != str(resource.sandbox_id):
            raise SandboxError(f"{folder} is not a sandbox folder of this server")
        # rmtree never follows links an agent may have planted (it works on folder fds).
        shutil.rmtree(folder, ignore_errors=True)

    # --- previews (docs/workbench.md) -------------------------------------------------------

    def listening_ports(self, sandbox: Sandbox) -> list[int]:
        """Return the TCP ports the sandbox's processes listen on.

        With a network of its own: every port of its namespace but those pasta holds for the
        allowed loopback endpoints. Otherwise the sandbox shares this machine's loopback with
        everything else on it, so only its own sockets count: those of its user, or (without
        sandbox users) those held by processes working in its folder.
        """
        root = self._root(sandbox)
        if not root.is_dir():
            raise SandboxError("the sandbox's folder is gone")
        if self._isolated_network():
            tables = network.run_inside(self.pool.first, sandbox.pk, ports.read_tables_here)
            forwarded = network.loopback_forwards(settings.CRAFT_SANDBOX_ALLOW)
            return ports.ports(ports.parse(tables), exclude=forwarded)
        listening = ports.parse(ports.read_tables())
        if self.uids:
            uid = self.pool.user_of(root).uid
            return ports.ports(socket for socket in listening if socket.uid == uid)
        inodes = ports.socket_inodes_under(root)
        return ports.ports(socket for socket in listening if socket.inode in inodes)

    def preview_connect(self, sandbox: Sandbox, port: int, timeout: float) -> socket.socket:
        """Return a socket connected to `port` on the sandbox's loopback (its own namespace's,
        made by a thread inside it; else this machine's, once the port is found to be one of
        the sandbox's own), IPv4 first, then IPv6."""
        if self._isolated_network():
            pool = self.pool

            def make(family: socket.AddressFamily) -> socket.socket:
                return network.run_inside(
                    pool.first, sandbox.pk, lambda: socket.socket(family, socket.SOCK_STREAM)
                )
        else:
            if port not in self.listening_ports(sandbox):
                raise SandboxError(f"nothing of the sandbox listens on port {port}")

            def make(family: socket.AddressFamily) -> socket.socket:
                return socket.socket(family, socket.SOCK_STREAM)

        return ports.connect_loopback(make, port, timeout)


class LocalGitRunner:
    """Runs Craft's git for one session of a local sandbox (`sandboxes.repository`)."""

    def __init__(
        self,
        backend: LocalBackend,
        sandbox: Sandbox,
        root: Path,
        session: str,
        user: containment.SandboxUser | None,
    ) -> None:
        self._backend = backend
        self._sandbox = sandbox
        self._root = root
        self._session = session
        self._user = user
        self._workspace = root / "sessions" / session
        self._stores = backend._git_stores_of(sandbox)
        self.workspace = str(self._workspace)
        self.store = GIT_STORE_IN_JAIL if user is not None else str(self._stores / session)

    def run(self, place: str, args: list[str]) -> LocalToolProcess:
        backend, user = self._backend, self._user
        python = containment.sandbox_python(backend.uids)
        command = [*containment.module_command(python, backend.tools, "git_tool"), *args]
        try:
            self._make_store()
            if place == "workspace":
                containment.private_folder(self._root, ("sessions", self._session), user)
        except OSError as exc:
            raise SandboxError(f"cannot create the session's git store: {exc}") from exc
        if user is None:
            return LocalToolProcess(command)
        store = self._stores / self._session
        if place == "remote":
            argv = backend._agent_jail(
                self._sandbox, command, self._root, self._root, user,
                binds=((store, GIT_STORE_IN_JAIL),), read_only_sandbox=True,
            )  # fmt: skip
        else:
            argv = backend._jailed(
                command,
                self._root,
                self._root,
                user,
                no_network=True,
                binds=((store, GIT_STORE_IN_JAIL),) if place == "store" else (),
                read_only_binds=((store, GIT_STORE_IN_JAIL),) if place == "workspace" else (),
                read_only_sandbox=place == "store",
            )
        return LocalToolProcess(backend._tool_budget(self._sandbox)(argv))

    def run_setup(self, argv: list[str]) -> LocalToolProcess:
        backend, user = self._backend, self._user
        env = containment.agent_environment(self._root, backend.tools, user)
        if user is None:
            return LocalToolProcess(argv, setup=True, env=env, cwd=self._workspace)
        argv = backend._agent_jail(self._sandbox, argv, self._root, self._workspace, user)
        leaf = backend.budget.agent_leaf(self._sandbox.pk) if backend.budget is not None else None
        if leaf is not None:
            argv = leaf.command(argv)
        return LocalToolProcess(argv, setup=True, env=env, cwd=self._workspace, leaf=leaf)

    def remove_store(self) -> None:
        containment.remove_private_folder(self._stores, (self._session,))

    def _make_store(self) -> None:
        """Create the session's store folder (the sandbox's user's, 0700, in a folder of
        root's that no sandbox user may enter); only an existing folder can be mounted."""
        stores = self._backend._git_stores_root()
        stores.mkdir(mode=0o700, parents=True, exist_ok=True)
        stores.chmod(0o700)
        containment.private_folder(stores, (str(self._sandbox.id), self._session), self._user)


def _measure(argv: list[str], sandbox: str) -> int | None:
    """Run `du` (argv) from the spawner thread, at most DISK_MEASURE_SECONDS; return the sum
    of the sizes it printed, or None."""
    try:
        process = _spawner.submit(
            _spawn,
            argv,
            env={"LANG": "C.UTF-8", "PATH": containment.SYSTEM_PATH},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ).result()
    except OSError as exc:
        logger.warning("cannot measure sandbox %s: %s", sandbox, exc)
        return None
    try:
        out, err = process.communicate(timeout=DISK_MEASURE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        logger.warning("measuring sandbox %s took over %g s", sandbox, DISK_MEASURE_SECONDS)
        return None
    sizes = [line.split(b"\t", 1)[0] for line in out.splitlines()]
    if not sizes or not all(size.isdigit() for size in sizes):
        logger.warning(
            "cannot measure sandbox %s: du exited %s: %s",
            sandbox, process.returncode, err.decode(errors="replace").strip()[-500:],
        )  # fmt: skip
        return None
    if process.returncode:
        # Some folders could not be read (the sandbox closed them to itself): counted without.
        logger.info(
            "sandbox %s: du could not read everything: %s",
            sandbox, err.decode(errors="replace").strip()[-300:],
        )  # fmt: skip
    return sum(int(size) for size in sizes)
