"""The checkpoint store is Craft's alone: nothing in a workspace makes Craft's git run a
program or change the bytes a checkpoint keeps, and the tool that writes a session's store
sees no other store.

Found from outside: a repository of the agent's deeper in the workspace, whose own config
named a clean filter, had that filter run by every later checkpoint (`git add` looks into a
repository it records as a commit), inside the tool's jail where every store of the sandbox
was mounted: it wrote into both sessions' stores.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
from pathlib import Path

import pytest

from sandboxes import services
from sandboxes.backends.local import STORE_IN_JAIL
from sandboxes.workspace import WorkspaceRefused

from .workspaces import Workspaces, read_all

pytestmark = pytest.mark.django_db(transaction=True)


def agents_repository(workspace: Workspaces, at: str, marker: Path) -> Path:
    """Make a repository of the agent's at `at` in the workspace, holding `lib.txt`, whose
    own configuration names a program for everything git may run (clean, smudge and process
    filters, a text conversion, an external diff, fsmonitor, hooks): each appends a line to
    `marker`. Return the path of `lib.txt`."""
    folder = workspace.folder / at
    folder.mkdir(parents=True)
    (folder / "lib.txt").write_bytes(b"library\n")
    (folder / ".gitattributes").write_bytes(b"* filter=x diff=x\n")
    quiet = ["-c", "user.name=agent", "-c", "user.email=agent@example.com"]
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), *quiet, "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(folder), *quiet, "commit", "-qm", "lib"], check=True)
    program = folder / ".git" / "run.sh"
    # A filter that passes the bytes through, as a real one would, after leaving its mark.
    program.write_text(f'#!/bin/sh\necho "ran $0 $*" >> {marker}\nexec cat\n')
    program.chmod(0o755)
    with open(folder / ".git" / "config", "a") as config:
        config.write(
            f'[filter "x"]\n\tclean = {program} clean\n\tsmudge = {program} smudge\n'
            f"\tprocess = {program} process\n\trequired = true\n"
            f'[diff "x"]\n\ttextconv = {program} textconv\n\tcommand = {program} diff\n'
            f"[core]\n\tfsmonitor = {program}\n\thooksPath = {folder / '.git' / 'hooks'}\n"
        )
    for hook in ("pre-commit", "post-commit", "post-checkout", "post-index-change"):
        (folder / ".git" / "hooks" / hook).symlink_to(program)
    for path in [folder, *folder.rglob("*")]:
        workspace.own(path)
    return folder / "lib.txt"


def test_a_nested_repositorys_filter_never_runs_and_the_repository_is_left_out(workspace):
    marker = workspace.folder.parent / "filter-ran"
    workspace.write("app.py", b"print(1)\n")
    workspace.write("tools/x/a.txt", b"a folder that becomes a repository\n")
    lib = agents_repository(workspace, "vendor/lib", marker)
    first = workspace.craft.checkpoint("start")
    subprocess.run(["git", "init", "-q", str(workspace.folder / "tools/x")], check=True)
    workspace.own(*(workspace.folder / "tools/x/.git").rglob("*"))
    # The same bytes with another time: a git that looks into the repository must hash
    # them again, through its clean filter.
    os.utime(lib, (1_000_000_000, 1_000_000_000))
    workspace.write("app.py", b"print(2)\n")
    second = workspace.craft.checkpoint("turn")
    assert not marker.exists(), marker.read_text()
    assert workspace.craft.unchanged(second.commit)
    watched, watch = workspace.craft.watched_checkpoint("watched", 60)
    os.utime(lib, (1_100_000_000, 1_100_000_000))  # heard by the watch, so git is asked
    assert watch.still()
    changes = by_path(workspace.craft.changes(first.commit, second.commit))
    assert {path: entry["status"] for path, entry in changes.items()} == {
        "app.py": "modified",
        "tools/x/a.txt": "deleted",  # its folder left the checkpoints with its repository
    }
    whole = _read(workspace.craft.diff("", second.commit))
    assert "app.py" in whole and "vendor" not in whole
    workspace.craft.revert(first.commit, second.commit, "vendor/lib/lib.txt", None)
    workspace.craft.revert(first.commit, second.commit, "", None)
    assert not marker.exists(), marker.read_text()
    # Left out and said so: neither its commit nor its files are recorded, and Revert
    # leaves it as it is.
    assert second.repositories == watched.repositories == ["tools/x", "vendor/lib"]
    assert read_all(workspace.craft, "app.py") == b"print(1)\n"
    assert lib.read_bytes() == b"library\n"
    recorded = [e["path"] for e in workspace.craft.changes("", second.commit)["files"]]
    assert recorded == ["app.py"]
    assert (workspace.folder / "tools/x/a.txt").is_file()


def test_a_nested_repository_already_in_the_index_is_never_looked_into(workspace):
    """A store from before this rule, or a repository made in the moment between the
    tool's walk and `git add`, leaves a gitlink in the store's index: `git add` would look
    into it whatever the exclusions say, so it is taken out first."""
    marker = workspace.folder.parent / "filter-ran"
    workspace.write("app.py", b"print(1)\n")
    lib = agents_repository(workspace, "vendor/lib", marker)
    workspace.craft.checkpoint("start")
    store = store_of(workspace)
    head = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(lib.parent), "rev-parse", "HEAD"],
        capture_output=True, check=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        ["git", "-c", "safe.directory=*", f"--git-dir={store}", "update-index", "--add",
         "--cacheinfo", f"160000,{head},vendor/lib"],
        check=True,
    )  # fmt: skip
    workspace.own(store / "index")  # rewritten by root just now
    os.utime(lib, (1_000_000_000, 1_000_000_000))
    taken = workspace.craft.checkpoint("turn")
    assert not marker.exists(), marker.read_text()
    recorded = [e["path"] for e in workspace.craft.changes("", taken.commit)["files"]]
    assert recorded == ["app.py"]


def store_of(workspace: Workspaces) -> Path:
    """Return the session's checkpoint store as this machine sees it."""
    session = str(workspace.session.pk)
    if workspace.backend == "kubernetes":  # /workspace/.craft-checkpoints/<session>
        return workspace.folder.parents[1] / ".craft-checkpoints" / session
    root = Path(services.workspace_path(workspace.sandbox, workspace.session.pk)).parents[2]
    return root / ".craft" / "checkpoints" / str(workspace.sandbox.pk) / session


ATTRIBUTES = b"""[attr]convert text eol=crlf ident
* convert
*.u16 working-tree-encoding=UTF-16
data.txt -diff
"""
FILES = {
    "lf.txt": b"one\ntwo\n",
    "crlf.txt": b"one\r\ntwo\r\n",
    "mixed.txt": b"one\r\ntwo\n",
    "id.txt": b"$Id$\nkept as it is\n",
    "plain.u16": b"not UTF-16 at all\n",
    "data.txt": b"a line\n",
}


def test_the_workspaces_attributes_never_change_what_a_checkpoint_keeps_or_revert_writes(
    workspace,
):
    """End-of-line and encoding conversions, `$Id$` expansion and `-diff` from the
    workspace's .gitattributes (through a macro, even) are not Craft's: a checkpoint keeps
    the bytes as they are, Revert writes them back as they were, the diff shows them."""
    workspace.write(".gitattributes", ATTRIBUTES)
    for name, content in FILES.items():
        workspace.write(name, content)
    first = workspace.craft.checkpoint("start")
    recorded = by_path(workspace.craft.changes("", first.commit))
    assert set(recorded) == {".gitattributes", *FILES}
    assert recorded["data.txt"]["binary"] is False
    assert "+one\r\n" in _read(workspace.craft.diff("", first.commit, "crlf.txt"))
    for name in FILES:
        (workspace.folder / name).unlink()
    second = workspace.craft.checkpoint("everything gone")
    workspace.craft.revert(first.commit, second.commit, "", None)
    for name, content in FILES.items():
        assert (workspace.folder / name).read_bytes() == content, name
    # One file, and one hunk, come back as they were too.
    workspace.write("lf.txt", b"one\nthree\n")
    third = workspace.craft.checkpoint("changed")
    workspace.craft.revert(first.commit, third.commit, "lf.txt", 0)
    assert (workspace.folder / "lf.txt").read_bytes() == FILES["lf.txt"]
    (workspace.folder / "id.txt").unlink()
    fourth = workspace.craft.checkpoint("gone again")
    workspace.craft.revert(first.commit, fourth.commit, "id.txt", None)
    assert (workspace.folder / "id.txt").read_bytes() == FILES["id.txt"]


def test_the_tool_writing_a_sessions_store_sees_no_other_store(local_workspace, owner):
    """The jail the tool writes a store from mounts that one store: told to use another
    session's, by the name it would have there or its path on the machine, git finds none
    of it, and the other store is as it was."""
    mine = local_workspace
    other = Workspaces(owner)
    assert other.sandbox.pk == mine.sandbox.pk
    other.write("theirs.txt", b"theirs\n")
    theirs = other.craft.checkpoint("theirs")
    mine.write("mine.txt", b"mine\n")
    mine.craft.checkpoint("mine")
    stores = Path(services.workspace_path(mine.sandbox, mine.session.pk)).parents[2]
    on_machine = stores / ".craft" / "checkpoints" / str(mine.sandbox.pk) / str(other.session.pk)
    assert (on_machine / "HEAD").is_file()
    for name in (f"{STORE_IN_JAIL}/{other.session.pk}", str(on_machine)):
        tool = copy.copy(mine.craft)
        tool._store = name  # the session's own tool, pointed at the other store
        with contextlib.suppress(WorkspaceRefused):
            tool.checkpoint("planted")  # at most a new repository, in its own store
        with pytest.raises(WorkspaceRefused):
            tool.changes("", theirs.commit)  # their commits are nowhere in sight
    assert other.craft.unchanged(theirs.commit)
    files = other.craft.changes("", theirs.commit)["files"]
    assert [entry["path"] for entry in files] == ["theirs.txt"]


def by_path(changes: dict) -> dict[str, dict]:
    return {entry["path"]: entry for entry in changes["files"]}


def _read(download) -> str:
    chunks = []
    while chunk := download.read():
        chunks.append(chunk)
    return b"".join(chunks).decode()
