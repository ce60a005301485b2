"""A fork's start on both backends (`Workspace.fork_from`, the workspace tool's `fork`): the
new session's checkpoint store becomes a copy of the source's, and its empty workspace gets
the files of one checkpoint, written by git as the sandbox's user. Every checkpoint of the
source is then one of the fork's: going back to an earlier one works in the fork."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from sandboxes import services
from sandboxes.backends.containment import CRAFT_DIR
from sandboxes.workspace import Workspace, WorkspaceRefused

pytestmark = pytest.mark.django_db(transaction=True)


def a_fork_of(workspace) -> tuple[Workspace, Path]:
    """Return a new session's workspace (made, empty) in the same sandbox, and its folder."""
    fork_id = uuid.uuid4()
    there = services.writable_workspace(workspace.sandbox, fork_id)
    return there, workspace.folder.parent / str(fork_id)


def files_in(folder: Path) -> dict[str, bytes | str]:
    """Every file (its bytes) and link (its target) below `folder`, by path."""
    found: dict[str, bytes | str] = {}
    for path in folder.rglob("*"):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[name] = os.readlink(path)
        elif path.is_file():
            found[name] = path.read_bytes()
    return found


def test_a_fork_gets_the_files_of_a_checkpoint_and_every_checkpoint_before_it(workspace):
    workspace.write("notes/todo.txt", b"ship it\n")
    workspace.write("run.sh", b"echo hi\n", 0o700)
    workspace.link("config", "/etc/passwd")
    first = workspace.craft.checkpoint("first").commit
    workspace.write("notes/todo.txt", b"changed since\n")
    workspace.write("later.txt", b"later\n")
    second = workspace.craft.checkpoint("second").commit
    source = files_in(workspace.folder)

    there, folder = a_fork_of(workspace)
    answer = there.fork_from(workspace.session.pk, second, 1 << 20)
    assert answer == {"files": 3, "bytes": 28}  # the link is no file
    assert files_in(folder) == {
        "notes/todo.txt": b"changed since\n", "run.sh": b"echo hi\n", "later.txt": b"later\n",
        "config": "/etc/passwd",
    }  # fmt: skip
    assert (folder / "run.sh").stat().st_mode & 0o100
    assert not (folder / "later.txt").stat().st_mode & 0o100

    # The source's checkpoints are the fork's: its first, reverted to in the fork, file by
    # file; the fork's own checkpoints follow from there; the source is left as it was.
    now = there.checkpoint("the fork's first")
    assert there.changes(second, now.commit)["files"] == []
    there.revert(first, now.commit)
    assert files_in(folder) == {
        "notes/todo.txt": b"ship it\n",
        "run.sh": b"echo hi\n",
        "config": "/etc/passwd",
    }
    back = there.checkpoint("back to the first")
    assert {f["path"] for f in there.changes(now.commit, back.commit)["files"]} == {
        "notes/todo.txt",
        "later.txt",
    }
    assert files_in(workspace.folder) == source
    again = workspace.craft.checkpoint("the source's again").commit
    assert workspace.craft.changes(second, again)["files"] == []


def test_a_fork_is_refused_into_files_past_its_limit_or_from_no_checkpoint(workspace):
    workspace.write("a.txt", b"a" * 100)
    workspace.write("b.txt", b"b" * 100)
    commit = workspace.craft.checkpoint("two files").commit

    there, folder = a_fork_of(workspace)
    for asked, code in ((("0" * 40, 1 << 20), "no_checkpoint"), ((commit, 150), "too_large")):
        with pytest.raises(WorkspaceRefused) as refused:
            there.fork_from(workspace.session.pk, *asked)
        assert refused.value.code == code
        assert files_in(folder) == {}
    (folder / "mine.txt").write_text("mine")
    with pytest.raises(WorkspaceRefused) as refused:
        there.fork_from(workspace.session.pk, commit, 1 << 20)
    assert refused.value.code == "not_empty"

    # Once forked, never again over it: the store has its checkpoints already.
    (folder / "mine.txt").unlink()
    there.fork_from(workspace.session.pk, commit, 1 << 20)
    for path in folder.iterdir():
        path.unlink()
    with pytest.raises(WorkspaceRefused) as refused:
        there.fork_from(workspace.session.pk, commit, 1 << 20)
    assert refused.value.code == "not_empty"


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox users need root")
def test_a_forks_files_and_store_are_the_sandbox_users_and_its_objects_hard_links(
    local_workspace, settings
):
    workspace = local_workspace
    workspace.write("deep/er/file.txt", b"deep\n")
    commit = workspace.craft.checkpoint("one file").commit
    there, folder = a_fork_of(workspace)
    there.fork_from(workspace.session.pk, commit, 1 << 20)
    owners = {os.lstat(path).st_uid for path in [folder, *folder.rglob("*")]}
    assert owners == {workspace.uid} and workspace.uid >= 1_000_000_000
    stores = (
        Path(settings.CRAFT_SANDBOX_ROOT) / CRAFT_DIR / "checkpoints" / str(workspace.sandbox.pk)
    )
    mine, theirs = stores / folder.name / "objects", stores / str(workspace.session.pk) / "objects"
    commit_object = f"{commit[:2]}/{commit[2:]}"
    assert (mine / commit_object).stat().st_ino == (theirs / commit_object).stat().st_ino
    assert {os.lstat(path).st_uid for path in mine.rglob("*")} == {workspace.uid}
