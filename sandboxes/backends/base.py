"""The small interface every sandbox backend implements."""

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from uuid import UUID

from sandboxes.errors import SandboxError as SandboxError  # where backends have raised it from

if TYPE_CHECKING:
    import socket

    from sandboxes.agent.process import AgentProcess
    from sandboxes.catalog import Launch
    from sandboxes.models import Sandbox
    from sandboxes.repository import Repository
    from sandboxes.workspace import Workspace

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Health:
    """What a health check found; `gone` means the folder or pod no longer exists (or is
    being deleted), so the sandbox cannot come back without being provisioned again."""

    ok: bool
    detail: str
    gone: bool = False


class WarmUnusable(SandboxError):
    """A warm sandbox cannot be claimed (its pod is gone, failed or not Ready): it has been
    dropped, and the sandbox is provisioned afresh instead."""


@dataclass(frozen=True)
class WarmState:
    """What a backend sees of one warm sandbox's pod: Ready, or why it never will be."""

    ready: bool
    failure: str = ""


@dataclass(frozen=True)
class Resource:
    """Something a backend holds for a sandbox, found by its own marks (see `inventory`)."""

    sandbox_id: UUID
    # "folder", "checkpoints", "network" (local), "pod", "service", "secret" (kubernetes)
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


class TerminalProcess(Protocol):
    """A shell on a pseudo-terminal, run where and as the sandbox's agents run
    (`SandboxBackend.start_terminal`). Its output is bytes as the terminal shows them."""

    ident: str
    # Whether `write` may wait (a websocket send): async callers then write from a thread.
    writes_block: bool

    def listen(self, output: Callable[[bytes], None], end: Callable[[], None]) -> None:
        """Call `output(chunk)` with what the terminal shows, in order, from one thread, then
        `end()` once when it closes (the shell and what holds the terminal are gone). Until
        this is called, output waits. Neither callback may block."""

    def write(self, data: bytes) -> None:
        """Type `data` into the terminal (raises OSError once it is closed)."""

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size; its foreground programs hear of it (SIGWINCH)."""

    def wait_exit(self, timeout: float) -> int | None:
        """Wait at most `timeout` seconds for the shell's exit code (None: not known)."""

    def terminate(self) -> None:
        """Hang the terminal up and kill what runs on it; idempotent."""


class SandboxBackend(Protocol):
    """Where a sandbox lives. Methods block; async callers run them in a thread."""

    name: str
    # Held while one of its agents starts (spawned until its ACP session is open), so that at
    # most so many start at once; None: no limit.
    start_slots: threading.Semaphore | None

    def provision(self, sandbox: "Sandbox", progress: Progress) -> str:
        """Create the sandbox's resources, wait until usable, return the backend reference.

        Idempotent: provisioning a sandbox that already exists adopts what is there.
        `progress` receives short status lines to show while this runs, at least one per
        poll while it waits; it raises when the caller stops provisioning (its server is
        stopping): let that go through, what was made is adopted by the next attempt.
        """

    def terminate(self, sandbox: "Sandbox") -> None:
        """Free the sandbox's resources; resources already gone count as freed."""

    def sleep(self, sandbox: "Sandbox") -> None:
        """Stop whatever runs in the sandbox and free what it costs while nobody uses it
        (a pod), keeping its files (a folder, a volume); `provision` wakes it. What is
        already stopped counts as stopped."""

    def workspace_path(self, sandbox: "Sandbox", session_id: UUID) -> str:
        """Return the session's workspace as the agent sees it (its working directory)."""

    def remove_workspace(self, sandbox: "Sandbox", session_id: UUID) -> None:
        """Remove the session's workspace; a missing one is fine."""

    def start_agent(
        self, sandbox: "Sandbox", session_id: UUID, launch: "Launch | None" = None
    ) -> "AgentProcess":
        """Start the launch's agent (default: the catalog's first, without credentials) in
        the session's workspace, creating the workspace if it does not exist yet. Its
        credentials reach the agent's environment only, never a command line."""

    def start_warm_agent(
        self, sandbox: "Sandbox", launch: "Launch | None" = None
    ) -> "AgentProcess":
        """Start the launch's agent as `start_agent` does, with the very same environment,
        but in `warm_path`, for no session yet: a warm agent, whose session is opened later
        with `session/new` in a workspace made by `make_workspace`."""

    def warm_path(self, sandbox: "Sandbox") -> str:
        """Return the folder warm agents start in: the sandbox's, and no session's."""

    def make_workspace(self, sandbox: "Sandbox", session_id: UUID) -> None:
        """Create the session's workspace if it does not exist (what `start_agent` does
        first), for a warm agent about to open the session there."""

    def start_terminal(
        self, sandbox: "Sandbox", session_id: UUID, cols: int, rows: int
    ) -> TerminalProcess:
        """Start a shell (`bash`, else `sh`; TERM=xterm-256color) on a terminal of `cols` by
        `rows` in the session's workspace, created if need be, exactly where and as its
        agent runs (the jail as the sandbox's user, the pod), in the agent's environment
        without its owner's credentials. The terminal is the shell's controlling one, so job
        control and Ctrl-C work."""

    def workspace(self, sandbox: "Sandbox", session_id: UUID) -> "Workspace":
        """Return the session's workspace, read with the agent's rights where the agent runs
        (`sandboxes.workspace`): confined to it, following no link, bounded."""

    def repository(self, sandbox: "Sandbox", session_id: UUID) -> "Repository":
        """Return the session's workspace as a git repository (`sandboxes.repository`):
        Craft's git for it runs where the agent runs, the owner's token only where the
        agent cannot see it."""

    def health(self, sandbox: "Sandbox") -> Health:
        """Check the sandbox now; `gone` only when its folder or pod certainly no longer is."""

    def inventory(self) -> list[Resource]:
        """Return every resource this backend holds for sandboxes (to find orphans and
        sandboxes whose resources vanished). Raises SandboxError when it cannot look."""

    def remove(self, resource: Resource) -> None:
        """Delete one resource that `inventory` returned; gone already counts as removed."""

    def disk_usage(self, sandbox: "Sandbox") -> int | None:
        """Return the bytes the sandbox's files take on disk (its workspaces, home and
        checkpoint stores), measured with the sandbox's own rights; None where the backend
        cannot tell. May take seconds: the reaper calls it."""

    def check_isolation(self) -> None:
        """Put back what keeps sandboxes apart if it went missing (the local network rule,
        the namespace's NetworkPolicy); the reaper calls this on every pass."""


@runtime_checkable
class WarmPool(Protocol):
    """A backend that can keep sandboxes ready before anyone owns them (`sandboxes.warm`).

    A warm sandbox has an id (the id of the sandbox that will claim it) and no owner.
    """

    def warm_target(self) -> int:
        """Return how many warm sandboxes to keep (the setting)."""

    def create_warm(self, sandbox_id: UUID) -> None:
        """Start a warm sandbox's resources (without waiting for them); 409s adopt."""

    def warm_states(self) -> "dict[UUID, WarmState]":
        """Return the state of every unclaimed warm sandbox the backend holds, by id."""

    def claim_warm(self, sandbox: "Sandbox", progress: Progress) -> str:
        """Hand the warm sandbox with `sandbox.id` to `sandbox`'s owner; return the backend
        reference. Raises WarmUnusable (after dropping it) when it is not Ready."""

    def remove_warm(self, sandbox_id: UUID) -> None:
        """Delete a warm sandbox's resources; gone already counts as removed."""


@runtime_checkable
class Previews(Protocol):
    """A backend that lets the sandbox's owner see an app served in the sandbox (a preview,
    docs/workbench.md): the ports listening there, and a connection to one of them."""

    def listening_ports(self, sandbox: "Sandbox") -> list[int]:
        """Return the TCP ports the sandbox's own processes listen on, in order."""

    def preview_connect(self, sandbox: "Sandbox", port: int, timeout: float) -> "socket.socket":
        """Return a blocking socket connected to `port` in the sandbox, within `timeout`
        seconds. Raise SandboxError when nothing of the sandbox listens there (the message
        is fit to show)."""
