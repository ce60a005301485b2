"""Checkpoints of a session's workspace: real git, on both backends, out of the agent's reach.

A checkpoint is a commit of the session's store (a bare git repository) with the workspace as
its work tree; `changes` and `diff` are git's own numstat, name-status and unified diff
between two of them. The store is written by the workspace tool; on the local backend the
agent cannot reach it, which the hostile agent tries.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandboxes import services
from sandboxes import workspace as workspace_module
from sandboxes.workspace import Workspace, WorkspaceRefused

from .hostile import ask
from .workspaces import read_all

pytestmark = pytest.mark.django_db(transaction=True)


def by_path(changes: dict) -> dict[str, dict]:
    return {entry["path"]: entry for entry in changes["files"]}


def test_a_checkpoint_records_what_changed_added_modified_deleted_renamed_binary(workspace):
    workspace.write("keep.txt", b"one\ntwo\n")
    workspace.write("gone.txt", b"bye\n")
    workspace.write("old-name.txt", b"a file long enough to be found renamed by git\n" * 3)
    first = workspace.craft.checkpoint("session start")
    assert len(first.commit) == 40
    workspace.write("keep.txt", b"one\n2\nthree\n")
    (workspace.folder / "gone.txt").unlink()
    (workspace.folder / "old-name.txt").rename(workspace.folder / "new-name.txt")
    workspace.write("src/new.py", b"print('new')\n")
    workspace.write("logo.png", b"\x89PNG\r\n\x1a\n\x00\x00binary")
    second = workspace.craft.checkpoint("turn 1")
    changes = workspace.craft.changes(first.commit, second.commit)
    files = by_path(changes)
    assert changes["truncated"] is False
    assert files["keep.txt"] == {
        "path": "keep.txt", "status": "modified", "added": 2, "removed": 1, "binary": False
    }  # fmt: skip
    assert files["gone.txt"]["status"] == "deleted"
    assert files["new-name.txt"]["status"] == "renamed"
    assert files["new-name.txt"]["old_path"] == "old-name.txt"
    assert files["src/new.py"] == {**files["src/new.py"], "status": "added", "added": 1}
    assert files["logo.png"]["binary"] is True
    assert set(files) == {"keep.txt", "gone.txt", "new-name.txt", "src/new.py", "logo.png"}
    # The first checkpoint against nothing: every file added.
    assert {e["status"] for e in workspace.craft.changes("", first.commit)["files"]} == {"added"}


def test_the_diff_is_gits_unified_diff_of_the_turn_or_of_one_file(workspace):
    workspace.write("a.txt", b"one\n")
    workspace.write("b.txt", b"bee\n")
    before = workspace.craft.checkpoint("before").commit
    workspace.write("a.txt", b"one\ntwo\n")
    workspace.write("b.txt", b"buzz\n")
    after = workspace.craft.checkpoint("after").commit
    whole = _read(workspace.craft.diff(before, after))
    assert "+++ b/a.txt" in whole and "+++ b/b.txt" in whole and "+two" in whole
    one = _read(workspace.craft.diff(before, after, "b.txt"))
    assert "a.txt" not in one and "-bee\n+buzz" in one
    # A path is literal: no wildcard reaches other files.
    assert _read(workspace.craft.diff(before, after, "*.txt")) == ""


def _read(download) -> str:
    chunks = []
    while chunk := download.read():
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_big_files_and_default_folders_are_left_out_and_said_so(workspace, settings):
    settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES = 1000
    workspace.write("small.txt", b"x")
    workspace.write("data/big.bin", b"y" * 2000)
    workspace.write("node_modules/lib/index.js", b"module.exports = 1\n")
    workspace.write("__pycache__/m.cpython-311.pyc", b"\0")
    workspace.write(".gitignore", b"secret.env\n")
    workspace.write("secret.env", b"TOKEN=1\n")
    checkpoint = workspace.craft.checkpoint("start")
    assert checkpoint.too_large == ["data/big.bin"]
    assert "node_modules/" in checkpoint.excluded
    recorded = {e["path"] for e in workspace.craft.changes("", checkpoint.commit)["files"]}
    assert recorded == {"small.txt", ".gitignore"}


def test_unchanged_says_whether_a_checkpoint_now_would_record_the_same(workspace, settings):
    settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES = 1000
    workspace.write("a.txt", b"one\n")
    workspace.write("big.bin", b"y" * 2000)
    workspace.write("node_modules/x.js", b"1\n")
    first = workspace.craft.checkpoint("start").commit
    assert workspace.craft.unchanged(first)
    # What checkpoints leave out changes nothing a checkpoint records.
    workspace.write("node_modules/x.js", b"2\n")
    workspace.write("big.bin", b"z" * 2000)
    assert workspace.craft.unchanged(first)
    # A new file, a modified one, a big file grown small: each is a change.
    workspace.write("new.txt", b"new\n")
    assert not workspace.craft.unchanged(first)
    (workspace.folder / "new.txt").unlink()
    assert workspace.craft.unchanged(first)
    workspace.write("a.txt", b"two\n")
    assert not workspace.craft.unchanged(first)
    second = workspace.craft.checkpoint("turn").commit
    assert workspace.craft.unchanged(second) and not workspace.craft.unchanged(first)
    workspace.write("big.bin", b"small\n")
    assert not workspace.craft.unchanged(second)


def test_the_agents_own_repository_is_content_and_its_config_runs_nothing(workspace):
    """A `.git` the agent made is not Craft's store: its files are checkpointed, and a hook
    or fsmonitor in its config is never run by Craft's git."""
    marker = workspace.folder.parent / "ran"
    workspace.write("app.py", b"print(1)\n")
    subprocess.run(["git", "init", "-q", str(workspace.folder)], check=True)
    config = workspace.folder / ".git" / "config"
    config.write_text(config.read_text() + f"[core]\n\tfsmonitor = touch {marker}\n")
    hook = workspace.write(".git/hooks/pre-commit", f"#!/bin/sh\ntouch {marker}\n".encode(), 0o755)
    workspace.own(*hook.parents)
    checkpoint = workspace.craft.checkpoint("start")
    recorded = {e["path"] for e in workspace.craft.changes("", checkpoint.commit)["files"]}
    assert recorded == {"app.py"}
    assert not marker.exists()
    assert (
        subprocess.run(["git", "-C", str(workspace.folder), "log"], capture_output=True).returncode
        != 0
    ), "the agent's repository got no commit from Craft"


def test_an_agent_that_deletes_everything_is_recorded_as_deleting_it(workspace):
    for index in range(5):
        workspace.write(f"f{index}.txt", b"x\n")
    before = workspace.craft.checkpoint("before").commit
    for entry in workspace.folder.iterdir():
        entry.unlink()
    after = workspace.craft.checkpoint("after").commit
    files = workspace.craft.changes(before, after)["files"]
    assert {f["status"] for f in files} == {"deleted"} and len(files) == 5


def test_a_checkpoint_over_the_timeout_is_skipped_and_the_next_one_works(workspace, settings):
    """4 GiB of zeros (sparse: no disk) for git to hash and compress takes seconds."""
    slow = workspace.write("zeros.bin")
    os.truncate(slow, 4 << 30)
    workspace.write("notes.txt", b"still here\n")
    settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES = 8 << 30
    settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS = 1
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.checkpoint("too slow")
    assert refused.value.code == "timeout"
    assert read_all(workspace.craft, "notes.txt") == b"still here\n"  # the session is usable
    slow.unlink()
    settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS = 120
    done = workspace.craft.checkpoint("in time")  # the lock the stopped one left is no obstacle
    assert [e["path"] for e in workspace.craft.changes("", done.commit)["files"]] == ["notes.txt"]


def test_the_agent_cannot_reach_the_checkpoint_store(local_workspace):
    """The store belongs to the sandbox's user (the tool writes it as that user), yet its
    agents cannot reach it: it lies behind a folder of root's and is only ever mounted in the
    tool's own jail."""
    workspace = local_workspace
    workspace.write("notes.txt", b"mine\n")
    workspace.craft.checkpoint("start")
    root = Path(services.workspace_path(workspace.sandbox, workspace.session.pk)).parents[2]
    store = root / ".craft" / "checkpoints" / str(workspace.sandbox.pk)
    session_store = store / str(workspace.session.pk)
    assert (session_store / "HEAD").is_file()
    assert os.stat(session_store).st_uid == workspace.uid  # so only the path keeps it apart
    agent = services.connect_agent(workspace.sandbox, workspace.session.pk)
    targets = [
        f"write:{session_store}/HEAD",
        f"list:{session_store}",
        f"list:{store.parent}",
        f"write:{store}/planted",
    ]
    results = ask(agent, "probe " + " ".join(targets))
    assert all(result in ("denied", "missing") for result in results.values()), results
    control = f"write:{workspace.folder}/ok.txt"  # the probe itself works
    assert ask(agent, f"probe {control}")[control] == "ok"


def test_a_session_deleted_takes_its_store_with_it(local_workspace):
    workspace = local_workspace
    workspace.craft.checkpoint("start")
    root = Path(services.workspace_path(workspace.sandbox, workspace.session.pk)).parents[2]
    store = root / ".craft" / "checkpoints" / str(workspace.sandbox.pk) / str(workspace.session.pk)
    assert store.is_dir()
    services.remove_session_workspace(workspace.sandbox, workspace.session.pk)
    assert not store.exists()


# --- reverting: git read-tree, checkout and apply -R on the store ---------------------------


def _turn(workspace, change) -> tuple[str, str]:
    """Checkpoints (before, after) around `change`, a function that edits the workspace."""
    before = workspace.craft.checkpoint("before").commit
    change()
    return before, workspace.craft.checkpoint("after").commit


def _revert(workspace, before, after, path="", hunk=None) -> None:
    workspace.craft.checkpoint("before the revert")  # as the runner does
    workspace.craft.revert(before, after, path, hunk)


def test_reverting_a_turn_puts_every_file_back_and_leaves_what_checkpoints_leave_out(workspace):
    folder = workspace.folder
    workspace.write("kept.txt", b"kept\n")
    workspace.write("edited.txt", b"one\n")
    workspace.write("deleted.txt", b"still here\n")

    def change():
        workspace.write("edited.txt", b"one\ntwo\n")
        (folder / "deleted.txt").unlink()
        workspace.write("added/new.txt", b"new\n")
        workspace.write("node_modules/lib.js", b"left out\n")

    before, after = _turn(workspace, change)
    _revert(workspace, before, after)
    assert (folder / "edited.txt").read_bytes() == b"one\n"
    assert (folder / "deleted.txt").read_bytes() == b"still here\n"
    assert not (folder / "added" / "new.txt").exists()
    assert (folder / "kept.txt").read_bytes() == b"kept\n"
    assert (folder / "node_modules" / "lib.js").read_bytes() == b"left out\n"


def test_reverting_one_file_leaves_the_others_and_brings_a_renamed_file_back(workspace):
    folder = workspace.folder
    workspace.write("a.txt", b"a\n")
    workspace.write("b.txt", b"b\n")
    workspace.write("old.txt", b"a file long enough to be found renamed by git\n" * 3)

    def change():
        workspace.write("a.txt", b"A\n")
        workspace.write("b.txt", b"B\n")
        (folder / "old.txt").rename(folder / "new.txt")

    before, after = _turn(workspace, change)
    _revert(workspace, before, after, "a.txt")
    assert (folder / "a.txt").read_bytes() == b"a\n"
    assert (folder / "b.txt").read_bytes() == b"B\n"
    _revert(workspace, before, after, "new.txt")
    assert (folder / "old.txt").exists() and not (folder / "new.txt").exists()


def test_reverting_one_hunk_undoes_that_hunk_only_and_refuses_when_it_no_longer_applies(
    workspace,
):
    folder = workspace.folder
    lines = [f"{n}\n".encode() for n in range(1, 31)]
    workspace.write("f.txt", b"".join(lines))

    def change():
        edited = list(lines)
        edited[2], edited[24] = b"three\n", b"twenty-five\n"
        workspace.write("f.txt", b"".join(edited))

    before, after = _turn(workspace, change)
    _revert(workspace, before, after, "f.txt", 1)  # the second hunk: line 25
    text = (folder / "f.txt").read_text()
    assert "three\n" in text and "\n25\n" in text and "twenty-five" not in text
    workspace.write("f.txt", b"rewritten\n")
    with pytest.raises(WorkspaceRefused) as refused:
        _revert(workspace, before, after, "f.txt", 0)
    assert refused.value.code == "conflict"
    assert (folder / "f.txt").read_bytes() == b"rewritten\n"  # nothing half done
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.revert(before, after, "f.txt", 7)
    assert refused.value.code == "no_such_hunk"


def test_a_revert_is_a_checkpoint_that_can_be_reverted(workspace):
    folder = workspace.folder
    workspace.write("a.txt", b"before\n")
    before, after = _turn(workspace, lambda: workspace.write("a.txt", b"after\n"))
    current = workspace.craft.checkpoint("before the revert").commit
    workspace.craft.revert(before, after)
    reverted = workspace.craft.checkpoint("the revert").commit
    assert (folder / "a.txt").read_bytes() == b"before\n"
    changes = workspace.craft.changes(current, reverted)
    assert [(e["path"], e["status"]) for e in changes["files"]] == [("a.txt", "modified")]
    _revert(workspace, current, reverted)  # the revert of the revert
    assert (folder / "a.txt").read_bytes() == b"after\n"


def test_a_revert_through_a_folder_swapped_for_a_link_writes_nothing_outside(workspace, tmp_path):
    folder = workspace.folder
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(outside, 0o777)  # writable by anyone: only the link may stop the write
    workspace.write("src/a.txt", b"a\n")
    before, after = _turn(workspace, lambda: workspace.write("src/a.txt", b"A\n"))
    (folder / "src" / "a.txt").unlink()
    (folder / "src").rmdir()
    workspace.link("src", outside)
    _revert(workspace, before, after, "src/a.txt")
    assert list(outside.iterdir()) == []
    assert (folder / "src" / "a.txt").read_bytes() == b"a\n"
    assert not (folder / "src").is_symlink()


# --- the watched checkpoint: taken ahead of a session's first turn, confirmed when it begins


@pytest.fixture
def git_not_asked(monkeypatch):
    """Fail the test if `Workspace.unchanged` (git, in a tool started for it) is asked."""
    asked: list[str] = []
    real = Workspace.unchanged

    def unchanged(workspace: Workspace, commit: str) -> bool:
        asked.append(commit)
        return real(workspace, commit)

    monkeypatch.setattr(Workspace, "unchanged", unchanged)
    return asked


def test_a_watched_checkpoint_is_still_true_at_once_while_nothing_changed(workspace, git_not_asked):
    workspace.write("a.txt", b"one\n")
    workspace.write("src/b.txt", b"bee\n")
    workspace.write("node_modules/x.js", b"1\n")
    taken, watch = workspace.craft.watched_checkpoint("start", 60)
    assert [e["path"] for e in workspace.craft.changes("", taken.commit)["files"]] == [
        "a.txt", "src/b.txt"
    ]  # fmt: skip
    # What checkpoints leave out is not watched either.
    (workspace.folder / "node_modules" / "x.js").write_bytes(b"2\n")
    (workspace.folder / "node_modules" / "y.js").write_bytes(b"new\n")
    assert watch.still()
    # The local tool heard nothing and said so; elsewhere git was asked.
    assert git_not_asked == ([] if workspace.backend == "local" else [taken.commit])


def test_the_watching_tool_outlives_its_answer_until_its_stdin_ends(local_workspace, monkeypatch):
    """Its exit tears down its jail: that happens a moment after the answer (when Craft
    closes its stdin), not while the turn the answer begins takes its first steps."""
    monkeypatch.setattr(workspace_module, "WATCH_END_DELAY_SECONDS", 6.0)
    workspace = local_workspace
    workspace.write("a.txt", b"one\n")
    _, watch = workspace.craft.watched_checkpoint("start", 600)
    tool = watching_tools(workspace.session.pk)  # the jail's processes, and the tool's
    assert tool
    assert watch.still()
    time.sleep(0.5)  # a tool that exits after answering is gone by now
    assert watching_tools(workspace.session.pk) == tool
    wait_until(lambda: not watching_tools(workspace.session.pk))


@pytest.mark.parametrize(
    "change",
    ["modify", "new file in a new folder", "delete", "rename", "chmod", "grow past the limit"],
)
def test_a_watched_checkpoint_is_not_still_after_a_change(workspace, settings, change):
    settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES = 1000
    workspace.write("a.txt", b"one\n")
    workspace.write("src/b.txt", b"bee\n")
    _, watch = workspace.craft.watched_checkpoint("start", 60)
    folder = workspace.folder
    if change == "modify":
        workspace.write("src/b.txt", b"bee?\n")
    elif change == "new file in a new folder":
        workspace.write("src/deeper/c.txt", b"c\n")
    elif change == "delete":
        (folder / "src" / "b.txt").unlink()
    elif change == "rename":
        (folder / "a.txt").rename(folder / "src" / "a.txt")
    elif change == "chmod":
        (folder / "a.txt").chmod(0o700)
    else:
        workspace.write("a.txt", b"x" * 2000)
    assert not watch.still()


def test_a_change_undone_before_the_turn_is_asked_of_git(workspace, git_not_asked):
    workspace.write("a.txt", b"one\n")
    taken, watch = workspace.craft.watched_checkpoint("start", 60)
    workspace.write("a.txt", b"two\n")
    workspace.write("a.txt", b"one\n")
    # The local tool ends at the first change it hears. Asked before it had read that change
    # (a busy machine), it would see both and ask git itself: right, but not this path.
    wait_until(lambda: not watching_tools(workspace.session.pk))
    assert watch.still()  # heard, so git decided: the same files
    assert git_not_asked == [taken.commit]


def test_a_file_with_a_second_name_outside_the_workspace_is_not_trusted_to_the_watch(
    local_workspace,
):
    """Written through a name outside the workspace, a hard-linked file changes without any
    watched folder hearing of it: such a workspace is confirmed by git."""
    workspace = local_workspace
    inside = workspace.write("linked.txt", b"one\n")
    outside = workspace.folder.parent / f"{workspace.session.pk}-outside.txt"
    os.link(inside, outside)
    try:
        _, watch = workspace.craft.watched_checkpoint("start", 60)
        outside.write_bytes(b"two\n")
        assert not watch.still()
    finally:
        outside.unlink()


def test_writes_racing_the_watched_checkpoint_are_never_missed(local_workspace):
    """A file rewritten over and over while the checkpoint is taken, then left alone: the
    watch's answer is always git's."""
    workspace = local_workspace
    path = workspace.write("busy.txt", b"0\n")

    def rewrite(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            path.write_bytes(f"{n}\n".encode())
            time.sleep(random.uniform(0, 0.02))

    verdicts = []
    for _ in range(8):
        stop = threading.Event()
        writer = threading.Thread(target=rewrite, args=(stop,))
        writer.start()
        try:
            taken, watch = workspace.craft.watched_checkpoint("start", 60)
        finally:
            stop.set()
            writer.join()
        still = watch.still()
        assert still == workspace.craft.unchanged(taken.commit)
        verdicts.append(still)
    assert False in verdicts  # the writer was heard


def test_the_watching_tool_ends_when_the_workspace_is_deleted_or_its_time_is_up(
    local_workspace, git_not_asked
):
    workspace = local_workspace
    workspace.write("a.txt", b"one\n")
    taken, watch = workspace.craft.watched_checkpoint("start", 0.2)
    wait_until(lambda: not watching_tools(workspace.session.pk))
    assert watch.still()  # git answered for the tool that gave up
    assert git_not_asked == [taken.commit]
    _, watch = workspace.craft.watched_checkpoint("again", 600)
    assert watching_tools(workspace.session.pk)
    services.remove_session_workspace(workspace.sandbox, workspace.session.pk)
    wait_until(lambda: not watching_tools(workspace.session.pk))
    watch.close()


def watching_tools(session_id) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"checkpoint-watch" in argv and any(str(session_id).encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.05)
