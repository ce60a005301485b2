"""The local backend: a sandbox is a folder on this machine, agents are subprocesses.

It needs nothing installed and is the embedded default. It isolates sessions by folder only,
not by user or kernel namespace: fit for one person's laptop or a trusted team, not for
strangers' code (use the kubernetes backend for that).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from django.conf import settings

from .base import Health, Progress, SandboxError

if TYPE_CHECKING:
    from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)
agent_stderr = logging.getLogger("craft.agent.stderr")


class LocalAgentProcess:
    """An agent running as a child process; its stderr goes to the log."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        try:
            # A new session (process group) so that terminate() reaches the agent's children.
            self._popen = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                # Bigger than the default 8 KiB: fewer reads (and GIL hand-overs) per line
                # of a fast stream. readline still returns each line as soon as it arrives.
                bufsize=1 << 16,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start agent {argv[0]!r}: {exc}") from exc
        self.ident = str(self._popen.pid)
        self.pid = self._popen.pid
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_thread = threading.Thread(
            target=self._pump_stderr, name=f"agent-stderr-{self.pid}", daemon=True
        )
        self._stderr_thread.start()

    def write(self, data: bytes) -> None:
        stdin = self._popen.stdin
        assert stdin is not None
        stdin.write(data)
        stdin.flush()

    def readline(self) -> bytes:
        # BufferedReader.readline has no length limit: multi-megabyte lines are normal in ACP.
        stdout = self._popen.stdout
        assert stdout is not None
        return stdout.readline()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_tail)

    def terminate(self, timeout: float = 5.0) -> None:
        """Close stdin (ACP agents exit on EOF), then SIGTERM, then SIGKILL the group."""
        try:
            if self._popen.stdin is not None:
                self._popen.stdin.close()
        except OSError:
            pass
        try:
            self._popen.wait(timeout=min(1.0, timeout))
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGTERM)
            try:
                self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._popen.wait()
        # The agent may have left children holding the pipes; the group is ours to clean.
        self._signal_group(signal.SIGKILL)
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _pump_stderr(self) -> None:
        stderr = self._popen.stderr
        assert stderr is not None
        try:
            for raw in iter(stderr.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                self._stderr_tail.append(line)
                agent_stderr.info("[%s] %s", self.pid, line)
        except (OSError, ValueError):
            pass  # closed by terminate()


def resolve_command(argv: list[str]) -> list[str]:
    """Find argv[0] on PATH or beside this Python (a virtualenv's bin is often not on PATH)."""
    if not argv:
        raise SandboxError("CRAFT_AGENT_COMMAND is empty")
    program = argv[0]
    if os.sep in program:
        return argv
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    found = shutil.which(program, path=search)
    if found is None:
        raise SandboxError(f"agent command {program!r} not found on PATH")
    return [found, *argv[1:]]


class LocalBackend:
    """Sandboxes as folders under `CRAFT_SANDBOX_ROOT`, agents as subprocesses."""

    name = "local"

    def _root(self, sandbox: Sandbox) -> Path:
        # Once provisioned, the reference is the folder: a later change of the root setting
        # must not orphan existing sandboxes.
        if sandbox.reference:
            return Path(sandbox.reference)
        return Path(settings.CRAFT_SANDBOX_ROOT) / str(sandbox.id)

    def _workspace(self, sandbox: Sandbox, session_id: UUID) -> Path:
        # session_id is a UUID, so the path cannot escape the sandbox folder.
        return self._root(sandbox) / "sessions" / str(UUID(str(session_id)))

    def provision(self, sandbox: Sandbox, progress: Progress) -> str:
        root = self._root(sandbox)
        progress("creating sandbox folder")
        try:
            (root / "sessions").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxError(f"cannot create sandbox folder: {exc}") from exc
        return str(root)

    def terminate(self, sandbox: Sandbox) -> None:
        shutil.rmtree(self._root(sandbox), ignore_errors=True)

    def workspace_path(self, sandbox: Sandbox, session_id: UUID) -> str:
        return str(self._workspace(sandbox, session_id))

    def create_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        try:
            self._workspace(sandbox, session_id).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxError(f"cannot create session workspace: {exc}") from exc

    def remove_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        shutil.rmtree(self._workspace(sandbox, session_id), ignore_errors=True)

    def start_agent(self, sandbox: Sandbox, session_id: UUID) -> LocalAgentProcess:
        workspace = self._workspace(sandbox, session_id)
        if not workspace.is_dir():
            raise SandboxError("session workspace does not exist")
        return LocalAgentProcess(resolve_command(list(settings.CRAFT_AGENT_COMMAND)), workspace)

    def health(self, sandbox: Sandbox) -> Health:
        root = self._root(sandbox)
        if root.is_dir():
            return Health(True, "folder present")
        return Health(False, "sandbox folder is missing")
