"""A session's workspace as a git repository: clone, set up, commit, push, update.

Craft's git runs where the agent runs, as the sandbox's user, never as the server's user on
a sandbox's files: each backend starts `git_tool.py` (standard library only, beside the
workspace tool) in a place made for one step and hands back its output as a `ToolProcess`;
this module speaks its protocol (progress lines, then one answer) and bounds each step.

Why two repositories. The workspace's `.git` belongs to the agent, and git runs what a
repository's configuration names (hooks, `core.fsmonitor`, filters, `credential.helper`,
`url.<x>.insteadOf`, `http.proxy`): git's own documentation says never to run git with a
secret in a repository one does not trust. So each session also has a **store**, a bare
repository that only Craft's git writes and that agents never see (`GitRunner`):

* **remote** steps (clone, fetch, push) run git in the store alone, with the sandbox's
  network and the owner's token. The token comes in on the tool's stdin (never a command
  line, never an environment variable), goes to a file in a folder private to that run, and
  reaches git through Craft's credential helper, which answers only for the remote's own
  protocol and host: a redirect elsewhere gets nothing. The workspace is not writable there.
* **store** and **workspace** steps move objects between the two by `git fetch` (which runs
  `upload-pack` on the repository it reads: what git documents as safe on an untrusted
  one), with no network and no token.
* commit, state and merge run git in the workspace, also with no network and no token,
  with hooks and fsmonitor turned off by Craft's own options. What the agent planted in its
  own `.git/config` that still runs there (a filter of its `.gitattributes`) runs with the
  agent's own rights, in its own sandbox, with nothing to steal: as if the agent ran it.

Every git gets no system or global configuration, no prompt, `protocol.allow=never` but
https (http only for a host that allows it, file only between store and workspace), no
submodule followed, no template. The agent gets a normal clone (its `origin`, with no
token, and the session's branch tracking `origin/<base>`) and commits as it likes; it cannot
push with its owner's token.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from .errors import SandboxError
from .workspace import ToolProcess, alarms

logger = logging.getLogger(__name__)

TOOL = "git_tool.py"
MAX_LINE = 1 << 20
SETUP_TAIL_BYTES = 4096
# The short steps (commit, state, a transfer between store and workspace).
LOCAL_STEP_SECONDS = 120.0


class GitRefused(SandboxError):
    """A git operation that could not be done; the message is fit to show to the user.

    Codes: repository_not_found, git_auth_failed, repository_too_large, git_timeout,
    push_rejected, nothing_to_commit, branch_not_found, git_failed.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Remote:
    """Where a session's repository comes from, and what reaches it."""

    url: str  # https://host[:port]/owner/name(.git); checked by craft.git_hosts already
    token: str = field(default="", repr=False)  # "" = anonymous (a public repository)
    username: str = "x-access-token"  # the user name the host wants beside a token
    allow_http: bool = False  # the host entry allows plain http (intranets, tests)
    submodules: bool = False  # the host entry allows fetching submodules

    def __repr__(self) -> str:
        token = "<set>" if self.token else "<none>"
        return f"Remote(url={self.url!r}, token={token}, username={self.username!r})"


@dataclass(frozen=True)
class Cloned:
    commit: str
    base: str  # the branch cloned (the given one, or the remote's default)
    branch: str


@dataclass(frozen=True)
class RepoState:
    branch: str
    head: str
    base: str
    ahead: int
    behind: int
    dirty: bool


@dataclass(frozen=True)
class SetupRun:
    ran: bool
    exit_code: int | None
    timed_out: bool
    tail: str  # the output's last ~4 KB


@dataclass(frozen=True)
class Updated:
    head: str
    conflicts: list[str]


class GitRunner(Protocol):
    """How a backend runs Craft's git for one session (the tool's arguments follow).

    `place` is where: "remote" (the sandbox's network, the store writable, the workspace
    not), "store" (no network, the store writable, the workspace read-only) or "workspace"
    (no network, the workspace writable, the store read-only). `store` and `workspace` are
    their paths as the tool sees them.
    """

    store: str
    workspace: str

    def run(self, place: str, args: list[str]) -> ToolProcess:
        """Start the git tool in `place`; its stdin is open for the request's line."""

    def run_setup(self, argv: list[str]) -> ToolProcess:
        """Start `argv` as the agent runs (its jail, its network, its environment without
        its owner's credentials), in the workspace, stdout and stderr as one stream."""

    def remove_store(self) -> None:
        """Remove the session's store (a failed clone leaves none)."""


class Repository:
    """One session's workspace as a git repository; methods block (callers use threads)."""

    def __init__(self, runner: GitRunner) -> None:
        self._runner = runner

    def clone(
        self,
        remote: Remote,
        *,
        base: str | None,
        branch_name: str,
        progress: Callable[[dict[str, Any]], None],
        max_bytes: int,
        timeout: float,
    ) -> Cloned:
        """Clone `remote` into the (empty) workspace and check out `branch_name`, made from
        `base` (None: the remote's default branch). A failed clone leaves the workspace
        empty and no store."""
        _check_url(remote)
        _check_name(branch_name)
        if base is not None:
            _check_name(base)
        runner = self._runner
        deadline = time.monotonic() + timeout  # for the whole clone
        if not self._step("workspace", None, ["look", runner.workspace])["empty"]:
            raise GitRefused("git_failed", "the session's workspace is not empty")
        try:
            stored = self._step(
                "remote", remote,
                ["clone-store", runner.store, remote.url, base or "", str(max_bytes)],
                timeout, progress, max_bytes,
            )  # fmt: skip
            found = str(stored["base"])
            try:
                cloned = self._step(
                    "workspace", remote,
                    ["checkout", runner.store, runner.workspace, remote.url, found, branch_name],
                    max(1.0, deadline - time.monotonic()), progress,
                )  # fmt: skip
            except BaseException:
                # The tool empties it when git fails; not when it was stopped midway.
                self._step("workspace", None, ["clear", runner.workspace])
                raise
        except BaseException:
            runner.remove_store()
            raise
        return Cloned(str(cloned["commit"]), found, branch_name)

    def setup(
        self, command: str | None, *, timeout: float, output: Callable[[str], None]
    ) -> SetupRun:
        """Run the repository's set-up where and as the agent runs, in the workspace:
        `command` (with `sh -c`), else `.craft/setup.sh` if there is one (else ran=False).
        Each line of its output goes to `output`; it is killed past `timeout`."""
        if command is None:
            found = self._step("workspace", None, ["look", self._runner.workspace])
            if not found.get("setup"):
                return SetupRun(False, None, False, "")
            argv = ["sh", ".craft/setup.sh"]
        else:
            argv = ["sh", "-c", command]
        process = self._runner.run_setup(argv)
        tail: collections.deque[bytes] = collections.deque()
        kept = 0
        watchdog = alarms.after(timeout, process.stop)
        try:
            while line := process.readline(MAX_LINE):
                tail.append(line)
                kept += len(line)
                while kept > SETUP_TAIL_BYTES and len(tail) > 1:
                    kept -= len(tail.popleft())
                output(line.decode(errors="replace").rstrip("\r\n"))
        finally:
            watchdog.cancel()
            code = process.finish(5.0)
        text = b"".join(tail)[-SETUP_TAIL_BYTES:].decode(errors="replace")
        if watchdog.rang:
            return SetupRun(True, None, True, text)
        return SetupRun(True, code, False, text)

    def state(self, base: str) -> RepoState:
        _check_name(base)
        answer = self._step("workspace", None, ["state", self._runner.workspace, base])
        return RepoState(
            str(answer["branch"]), str(answer["head"]), str(answer["base"]),
            int(answer["ahead"]), int(answer["behind"]), bool(answer["dirty"]),
        )  # fmt: skip

    def commit(self, message: str, *, name: str, email: str) -> str:
        """Commit everything in the workspace as `name <email>`; return the new commit.
        Raises GitRefused `nothing_to_commit`."""
        args = ["commit", self._runner.workspace, message, name, email]
        return str(self._step("workspace", None, args)["commit"])

    def push(self, remote: Remote, branch: str, *, timeout: float) -> str:
        """Push the workspace's `branch` to the remote's `branch`, never forced: a remote
        branch with commits the session lacks is refused (`push_rejected`). Return the
        commit pushed."""
        _check_url(remote)
        _check_name(branch)
        runner = self._runner
        self._step("store", remote, ["import", runner.store, runner.workspace, branch], timeout)
        answer = self._step("remote", remote, ["push", runner.store, remote.url, branch], timeout)
        return str(answer["head"])

    def update(self, remote: Remote, base: str, *, timeout: float) -> Updated:
        """Fetch the remote's `base` and merge it into the workspace's branch; conflicts
        are left in the worktree and listed."""
        _check_url(remote)
        _check_name(base)
        runner = self._runner
        self._step("remote", remote, ["fetch", runner.store, remote.url, base], timeout)
        answer = self._step("workspace", remote, ["merge", runner.store, runner.workspace, base])
        return Updated(str(answer["head"]), [str(path) for path in answer["conflicts"]])

    def _step(
        self,
        place: str,
        remote: Remote | None,
        args: list[str],
        timeout: float = LOCAL_STEP_SECONDS,
        progress: Callable[[dict[str, Any]], None] | None = None,
        max_bytes: int = 0,
    ) -> dict[str, Any]:
        """Run one step of the tool; return its answer, or raise its refusal."""
        options = []
        if remote is not None and remote.allow_http:
            options.append("--allow-http")
        if remote is not None and remote.submodules:
            options.append("--submodules")
        secrets: dict[str, str] = {}
        if place == "remote" and remote is not None and remote.token:
            secrets = {"token": remote.token, "username": remote.username}
        process = self._runner.run(place, [*options, *args])
        watchdog = alarms.after(timeout, process.stop)
        too_large = False
        try:
            try:
                process.write(json.dumps(secrets).encode() + b"\n")
            except OSError:
                pass  # it ended already: its answer (or none) says why
            process.close_stdin()
            while line := process.readline(MAX_LINE):
                try:
                    said = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(said, dict):
                    continue
                if "progress" in said and isinstance(said["progress"], dict):
                    step = said["progress"]
                    received = step.get("bytes")
                    if max_bytes and isinstance(received, int) and received > max_bytes:
                        too_large = True  # its own check failed: it goes now
                        process.stop()
                        break
                    if progress is not None:
                        progress(step)
                elif isinstance(said.get("error"), dict):
                    error = said["error"]
                    raise GitRefused(str(error.get("code")), str(error.get("message")))
                elif isinstance(said.get("answer"), dict):
                    return said["answer"]
        finally:
            watchdog.cancel()
            code = process.finish(5.0)
        if too_large:
            raise GitRefused(
                "repository_too_large", f"the repository is larger than {_size(max_bytes)}"
            )
        if watchdog.rang:
            raise GitRefused("git_timeout", f"git took longer than {timeout:g} s and was stopped")
        raise GitRefused("git_failed", f"git gave no answer (exit code {code}); see the server log")


def _check_url(remote: Remote) -> None:
    """Refuse what is not https (or http, for a host that allows it) before git sees it."""
    parts = urlsplit(remote.url)
    schemes = ("https", "http") if remote.allow_http else ("https",)
    if parts.scheme not in schemes or not parts.hostname or "@" in parts.netloc:
        raise GitRefused("git_failed", "the repository's URL is not one Craft clones")


def _check_name(name: str) -> None:
    """Refuse a branch name git would take for an option or that it does not allow."""
    bad = (
        not name or name.startswith(("-", "/", ".")) or name.endswith(("/", ".", ".lock"))
        or ".." in name or "@{" in name or "//" in name
        or any(char in name for char in " ~^:?*[\\\x7f") or any(ord(c) < 32 for c in name)
    )  # fmt: skip
    if bad:
        raise GitRefused("git_failed", f"{name!r} is not a branch name git allows")


def _size(size: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:g} {name}"
    return f"{size} bytes"
