"""Runs Craft's git for a session's repository, inside the sandbox: clone, commit, push, update.

Like `workspace_tool.py` (installed beside it, standard library only), the backends run this
program where the agent runs and with the agent's rights, each time in a place made for one
step (`sandboxes.repository` says which). Two repositories are involved:

* **the store**: a bare repository that only Craft's git writes, which agents never see. The
  only git that ever holds a token runs here, and only here is there a network: clone,
  fetch and push.
* **the workspace**: the agent's own clone. Its `.git` is the agent's (configuration, hooks,
  attributes): untrusted. Git runs in it without a network and without a token. It is made
  by copying the store's files (`git clone --local --no-hardlinks`: the store is Craft's own,
  and nothing is packed again); then objects go between the two by `git fetch`, which runs
  `upload-pack` in the repository it reads from (what git documents as safe on a repository
  one does not trust).

Usage: git_tool.py <command> [arguments]; stdin holds one JSON line, the request's secrets
(`{"token", "username"}` for the commands that reach the remote, `{}` otherwise).

* `clone-store <store> <url> <base> <max bytes>`: clone `url` bare into the empty `store`;
  `base` "" is the remote's default branch.
* `checkout <store> <workspace> <url> <base> <branch>`: clone the store into the empty
  workspace, `origin` set to `url`, `branch` made from `origin/<base>` and checked out.
* `commit <workspace> <message> <name> <email>`: commit everything (`git add -A`).
* `state <workspace> <base>`: the branch, its head, ahead/behind `origin/<base>`, dirty.
* `import <store> <workspace> <branch>`: the store fetches the workspace's `branch`.
* `push <store> <url> <branch>`: push what `import` brought to the remote's `branch`.
* `fetch <store> <url> <base>`: fetch the remote's `base` into the store.
* `merge <store> <workspace> <base>`: the workspace fetches `base` from the store and merges
  `origin/<base>`; conflicts are left in the worktree.
* `look <workspace>`: whether it is empty, and whether `.craft/setup.sh` is a file.
* `clear <workspace>`: remove everything in it (a clone that was stopped midway).
* `credential <file> <action>`: git's credential helper (see `credential`).

Options `--allow-http` and `--submodules` come before the command. Progress comes as
`{"progress": {...}}` lines; the last line is `{"answer": {...}}` or `{"error": {"code",
"message"}}`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from urllib.parse import urlsplit

# Every git Craft runs: no configuration but the repository's own and these (no system or
# global file, nothing from the environment), no hooks, no fsmonitor, no pager or editor,
# no prompt, no credential helper but Craft's, no transport but https (`transports`), no
# submodule followed.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PROTOCOL_FROM_USER": "0",
    "HOME": "/nonexistent",
    "LC_ALL": "C",
}
SAFE = (
    "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
    "-c", "core.pager=cat", "-c", "core.editor=false", "-c", "core.askPass=",
    "-c", "credential.helper=", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
    "-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false", "-c", "init.templateDir=",
    "-c", "protocol.allow=never", "-c", "protocol.https.allow=always",
)  # fmt: skip
# Where git's progress lines begin, and the phase each names.
PHASES = {
    "Counting objects": "counting",
    "Enumerating objects": "counting",
    "Compressing objects": "compressing",
    "Receiving objects": "receiving",
    "Resolving deltas": "resolving",
    "Updating files": "checkout",
}
_PROGRESS = re.compile(r"^(?:remote: )?([A-Z][a-z]+ [a-z]+):\s+(?:(\d+)% )?\(?(\d+)?/?(\d+)?\)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)")
UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
PROGRESS_EVERY = 0.25  # seconds: at most four progress lines a second
# Left out of the agent's commits: the demo agent's own state (it keeps it in the workspace).
EXCLUDED = b".craft-demo-agent/\n"


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def say(data: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


class Git:
    """git with the safe options, the transports the remote's host allows and, for the
    commands that reach it, Craft's credential helper."""

    def __init__(self, allow_http: bool, submodules: bool, helper: str = "") -> None:
        self.options = list(SAFE)
        if allow_http:
            self.options += ["-c", "protocol.http.allow=always"]
        if not submodules:
            self.options += ["-c", "submodule.recurse=false"]
        if helper:
            self.options += ["-c", f"credential.helper={helper}"]

    def argv(self, *args: str, local: bool = False) -> list[str]:
        # `local`: objects go between the store and the workspace, by path.
        extra = ["-c", "protocol.file.allow=always"] if local else []
        return ["git", *self.options, *extra, *args]

    def run(self, *args: str, cwd: str = ".", local: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args, local=local), cwd=cwd, env=environment(), capture_output=True,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip

    def out(self, *args: str, cwd: str = ".", local: bool = False) -> str:
        done = self.run(*args, cwd=cwd, local=local)
        if done.returncode != 0:
            raise failure(args[0], done.stderr.decode(errors="replace"))
        return done.stdout.decode(errors="replace").strip()

    def progressing(
        self, *args: str, cwd: str = ".", phase: str = "", max_bytes: int = 0, local: bool = False
    ) -> str:
        """Run git with `--progress`, telling its progress (every phase as `phase`, if given);
        stop it past `max_bytes` received. Return what it wrote to stderr."""
        process = subprocess.Popen(
            self.argv(*args, local=local), cwd=cwd, env=environment(), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert process.stderr is not None
        said = 0.0
        pending: dict[str, object] | None = None
        kept = b""
        buffer = b""
        too_large = False
        while chunk := os.read(process.stderr.fileno(), 65536):
            buffer += chunk
            *lines, buffer = re.split(rb"[\r\n]", buffer)
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                if not line:
                    continue
                kept = (kept + raw + b"\n")[-8192:]
                step = progress_of(line)
                if step is None:
                    continue
                if phase:
                    step["phase"] = phase
                if max_bytes and isinstance(step["bytes"], int) and step["bytes"] > max_bytes:
                    too_large = True
                    process.kill()
                # Each phase's last word is told, then at most four lines a second.
                if pending is not None and pending["phase"] != step["phase"]:
                    say({"progress": pending})
                pending = step
                if time.monotonic() - said >= PROGRESS_EVERY:
                    say({"progress": pending})
                    said, pending = time.monotonic(), None
        code = process.wait()
        if pending is not None:
            say({"progress": pending})
        if too_large:
            raise too_large_refusal(max_bytes)
        stderr = kept.decode(errors="replace")
        if code != 0:
            raise failure(args[0], stderr)
        return stderr


def environment() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV}


def progress_of(line: str) -> dict[str, object] | None:
    """Read one of git's progress lines ("Receiving objects:  45% (450/1000), 1.20 MiB")."""
    match = _PROGRESS.match(line)
    if match is None or match.group(1) not in PHASES:
        return None
    size = _SIZE.search(line, match.end())
    return {
        "phase": PHASES[match.group(1)],
        "percent": int(match.group(2)) if match.group(2) else None,
        "done": int(match.group(3)) if match.group(3) else None,
        "total": int(match.group(4)) if match.group(4) else None,
        "bytes": int(float(size.group(1)) * UNITS[size.group(2)]) if size else None,
        "text": line.removeprefix("remote: "),
    }


def too_large_refusal(max_bytes: int) -> Refused:
    return Refused("repository_too_large", f"the repository is larger than {size_text(max_bytes)}")


def size_text(size: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:g} {name}"
    return f"{size} bytes"


def failure(command: str, stderr: str) -> Refused:
    """Say plainly why git `command` failed, from what it wrote."""
    text = stderr.strip()
    lowered = text.lower()
    last = text.splitlines()[-1] if text else f"git {command} failed"
    if (
        "authentication failed" in lowered
        or "could not read username" in lowered
        or "could not read password" in lowered
        or "returned error: 401" in lowered
        or "returned error: 403" in lowered
    ):
        return Refused("git_auth_failed", "the git host refused the token (access denied)")
    if ("not found" in lowered and "remote ref" not in lowered) or "error: 404" in lowered:
        return Refused("repository_not_found", "the repository was not found")
    if "couldn't find remote ref" in lowered:
        return Refused("branch_not_found", "the branch was not found on the remote")
    return Refused("git_failed", f"git {command} failed: {last[-500:]}")


# --- the credential helper -----------------------------------------------------------------


class Credentials:
    """The token for one remote, in a file of a folder private to this run (in the jail's own
    /tmp), given to git through a helper that answers for that remote's host only."""

    def __init__(self, url: str, secrets: dict[str, str]) -> None:
        self.folder = ""
        self.helper = ""
        token = secrets.get("token") or ""
        if not token:
            return
        parts = urlsplit(url)
        self.folder = tempfile.mkdtemp(prefix="craft-git-")
        path = os.path.join(self.folder, "credentials")
        wanted = {
            "protocol": parts.scheme,
            "host": parts.netloc.rsplit("@", 1)[-1].lower(),
            "username": secrets.get("username") or "x-access-token",
            "password": token,
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(wanted, handle)
        me = os.path.abspath(__file__)
        self.helper = "!" + shlex.join([sys.executable, "-I", "-S", me, "credential", path])

    def remove(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def credential(path: str, action: str) -> int:
    """Answer git's `get` with the user name and token when git asks for the remote's own
    protocol and host (a redirect or another host gets nothing); ignore `store`/`erase`."""
    asked = {}
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line:
            break
        key, _, value = line.partition("=")
        asked[key] = value
    if action != "get":
        return 0
    with open(path) as handle:
        wanted = json.load(handle)
    host = asked.get("host", "").lower()
    if asked.get("protocol") == wanted["protocol"] and host == wanted["host"]:
        sys.stdout.write(f"username={wanted['username']}\npassword={wanted['password']}\n")
    return 0


# --- the commands ----------------------------------------------------------------------------


def empty(folder: str) -> None:
    """Remove everything in `folder` (not the folder: it is a mount, or the workspace)."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def size_of(folder: str) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                pass
    return total


def clone_store(git: Git, store: str, url: str, base: str, max_bytes: int) -> dict[str, object]:
    os.makedirs(store, mode=0o700, exist_ok=True)  # in a volume of stores, on Kubernetes
    if os.listdir(store):
        raise Refused("git_failed", "the session's git store is not empty")
    try:
        git.progressing(
            "clone", "--bare", "--progress", "--template=", "--", url, store, max_bytes=max_bytes
        )
        if max_bytes and size_of(store) > max_bytes:
            raise too_large_refusal(max_bytes)
        if not base:
            head = git.out("symbolic-ref", "--quiet", "HEAD", cwd=store)
            base = head.removeprefix("refs/heads/")
        wanted = f"refs/heads/{base}^{{commit}}"
        done = git.run("rev-parse", "--verify", "--quiet", wanted, cwd=store)
        if done.returncode != 0:
            raise Refused("branch_not_found", f"the remote has no branch {base}")
    except BaseException:
        empty(store)
        raise
    return {"base": base, "commit": done.stdout.decode().strip()}


def checkout(
    git: Git, store: str, workspace: str, url: str, base: str, branch: str
) -> dict[str, object]:
    if os.listdir(workspace):
        raise Refused("git_failed", "the session's workspace is not empty")
    # Copying the store's files says nothing (no objects are received), and git tells how the
    # files are written only when that takes seconds: the phase is named here.
    say({"progress": {"phase": "checkout", "percent": None, "done": None, "total": None,
                      "bytes": None, "text": "Checking out the files"}})  # fmt: skip
    try:
        git.progressing(
            "clone", "--local", "--no-hardlinks", "--template=", "--no-checkout",
            "--progress", "--branch", base, "--", store, ".",
            cwd=workspace, phase="checkout", local=True,
        )  # fmt: skip
        git.out("remote", "set-url", "origin", url, cwd=workspace)
        os.makedirs(os.path.join(workspace, ".git", "info"), exist_ok=True)
        with open(os.path.join(workspace, ".git", "info", "exclude"), "ab") as exclude:
            exclude.write(EXCLUDED)
        git.progressing(
            "checkout", "--progress", "-b", branch, "--track", f"origin/{base}",
            cwd=workspace, phase="checkout",
        )  # fmt: skip
        commit = git.out("rev-parse", "HEAD", cwd=workspace)
    except BaseException:
        empty(workspace)
        raise
    return {"commit": commit, "base": base, "branch": branch}


def commit(git: Git, workspace: str, message: str, name: str, email: str) -> dict[str, object]:
    git.out("add", "--all", cwd=workspace)
    if git.run("diff", "--cached", "--quiet", "--no-ext-diff", cwd=workspace).returncode == 0:
        raise Refused("nothing_to_commit", "there is nothing to commit")
    identity = ["-c", f"user.name={name}", "-c", f"user.email={email}"]
    git.out(*identity, "commit", "--quiet", "--no-verify", "-m", message, cwd=workspace)
    return {"commit": git.out("rev-parse", "HEAD", cwd=workspace)}


def state(git: Git, workspace: str, base: str) -> dict[str, object]:
    branch = git.out("symbolic-ref", "--quiet", "--short", "HEAD", cwd=workspace)
    head = git.out("rev-parse", "HEAD", cwd=workspace)
    counts = git.out(
        "rev-list", "--left-right", "--count", f"HEAD...refs/remotes/origin/{base}", cwd=workspace
    ).split()
    status = git.out("status", "--porcelain", "--ignore-submodules=all", cwd=workspace)
    return {
        "branch": branch, "head": head, "base": base,
        "ahead": int(counts[0]), "behind": int(counts[1]), "dirty": bool(status),
    }  # fmt: skip


def import_branch(git: Git, store: str, workspace: str, branch: str) -> dict[str, object]:
    done = git.run(
        "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", workspace,
        f"+refs/heads/{branch}:refs/craft/push/{branch}", cwd=store, local=True,
    )  # fmt: skip
    if done.returncode != 0:
        refused = failure("fetch", done.stderr.decode(errors="replace"))
        if refused.code == "branch_not_found":
            raise Refused("branch_not_found", f"the workspace has no branch {branch}")
        raise refused
    return {"head": git.out("rev-parse", f"refs/craft/push/{branch}", cwd=store)}


def push(git: Git, store: str, url: str, branch: str) -> dict[str, object]:
    # Never forced: a remote branch that moved on is refused, never overwritten.
    done = git.run(
        "push", "--porcelain", "--no-verify", "--", url,
        f"refs/craft/push/{branch}:refs/heads/{branch}", cwd=store,
    )  # fmt: skip
    out = done.stdout.decode(errors="replace")
    for line in out.splitlines():
        if line.startswith("!") and "rejected" in line:
            reason = line.rsplit("\t", 1)[-1]
            raise Refused(
                "push_rejected",
                f"the remote's {branch} has commits this session does not have; "
                f"update from the remote first ({reason})",
            )
    if done.returncode != 0:
        raise failure("push", done.stderr.decode(errors="replace"))
    return {"branch": branch, "head": git.out("rev-parse", f"refs/craft/push/{branch}", cwd=store)}


def fetch(git: Git, store: str, url: str, base: str) -> dict[str, object]:
    git.progressing(
        "fetch", "--progress", "--no-tags", "--no-write-fetch-head", "--", url,
        f"+refs/heads/{base}:refs/heads/{base}", cwd=store,
    )  # fmt: skip
    return {"commit": git.out("rev-parse", f"refs/heads/{base}", cwd=store)}


def merge(git: Git, store: str, workspace: str, base: str) -> dict[str, object]:
    git.out(
        "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", store,
        f"+refs/heads/{base}:refs/remotes/origin/{base}", cwd=workspace, local=True,
    )  # fmt: skip
    identity = ["-c", "user.name=Craft", "-c", "user.email=craft@localhost"]
    done = git.run(
        *identity, "merge", "--no-edit", "--no-verify", "--no-stat", f"refs/remotes/origin/{base}",
        cwd=workspace,
    )  # fmt: skip
    conflicts: list[str] = []
    if done.returncode != 0:
        listed = git.out("diff", "--name-only", "--diff-filter=U", "-z", cwd=workspace)
        conflicts = [path for path in listed.split("\0") if path]
        if not conflicts:
            raise failure("merge", (done.stderr + done.stdout).decode(errors="replace"))
    return {"head": git.out("rev-parse", "HEAD", cwd=workspace), "conflicts": conflicts}


def clone_store_command(
    git: Git, store: str, url: str, base: str, max_bytes: str
) -> dict[str, object]:
    return clone_store(git, store, url, base, int(max_bytes))


def clear(git: Git, path: str) -> dict[str, object]:
    empty(path)
    return {}


def look(git: Git, path: str) -> dict[str, object]:
    """Whether a workspace is empty and has a set-up script, made first if it is missing."""
    os.makedirs(path, mode=0o700, exist_ok=True)  # before its agent's first start
    setup = os.path.isfile(os.path.join(path, ".craft", "setup.sh"))
    return {"empty": not os.listdir(path), "setup": setup}


# command: what carries it out (given the Git, then the command's arguments), and how many
# arguments it takes
COMMANDS: dict[str, tuple[Callable[..., dict[str, object]], int]] = {
    "clone-store": (clone_store_command, 4), "checkout": (checkout, 5), "commit": (commit, 4),
    "state": (state, 2), "import": (import_branch, 3), "push": (push, 3), "fetch": (fetch, 3),
    "merge": (merge, 3), "look": (look, 1), "clear": (clear, 1),
}  # fmt: skip
REMOTE = {"clone-store": 1, "push": 1, "fetch": 1}  # the commands with a URL: its position


def main(argv: list[str]) -> int:
    if argv[:1] == ["credential"] and len(argv) == 3:
        return credential(argv[1], argv[2])
    allow_http = "--allow-http" in argv
    submodules = "--submodules" in argv
    argv = [arg for arg in argv if arg not in ("--allow-http", "--submodules")]
    if not argv or argv[0] not in COMMANDS or COMMANDS[argv[0]][1] != len(argv) - 1:
        say({"error": {"code": "usage", "message": "usage: git_tool.py <command> [arguments]"}})
        return 2
    command, *args = argv
    try:
        secrets = json.loads(sys.stdin.readline() or "{}")
    except ValueError:
        secrets = {}
    credentials = Credentials(args[REMOTE[command]] if command in REMOTE else "", secrets)
    git = Git(allow_http, submodules, credentials.helper)
    try:
        answer = COMMANDS[command][0](git, *args)
    except Refused as refused:
        say({"error": {"code": refused.code, "message": str(refused)}})
        return 0
    except OSError as exc:
        say({"error": {"code": "git_failed", "message": exc.strerror or str(exc)}})
        return 1
    finally:
        credentials.remove()
    say({"answer": answer})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
