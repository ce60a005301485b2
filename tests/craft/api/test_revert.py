"""Reverting what turns did to the workspace, through daphne: a turn, a file, a hunk, a revert.

The real demo agent writes, renames and deletes files after permissions; the checkpoints are
real git commits; the revert is asked over HTTP (with the session cookie and CSRF, as the page
asks it) and shows up as a `workspace_reverted` event on the session's websocket.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from craft.models import WorkspaceRevert
from craft.turns.checkpoints import checkpoints_of, latest_checkpoint
from sandboxes import services as sandbox_services
from tests.ready import open_ready_session
from tests.server import Daphne, Socket

from ..wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def is_turn_end(frame: dict[str, Any]) -> bool:
    return frame.get("kind") == "turn_end"


def of_kind(kind: str):
    return lambda frame: frame.get("kind") == kind


class Person:
    """A signed-in person with the session open: its socket, and HTTP with CSRF."""

    def __init__(self, server: Daphne, user, session) -> None:
        self.server = server
        self.session = session
        self.socket = Socket(server, user, session.pk)
        self.socket.send({"type": "resume", "after": 0})
        with urllib.request.urlopen(f"{server.url}/accounts/login/", timeout=30) as page:
            cookies = page.headers.get_all("Set-Cookie")
        self.csrf = next(re.match(r"csrftoken=([^;]+)", c)[1] for c in cookies if "csrftoken" in c)
        self.cookie = f"{session_cookie(user)}; csrftoken={self.csrf}"
        self.prompts = 0

    def turn(self, text: str, option: str = "allow") -> int:
        """Send a prompt, allow what it asks, wait for its changes; return its seq."""
        self.prompts += 1
        self.socket.send({"type": "prompt", "id": f"p{self.prompts}", "text": text})
        frames = self.socket.until(of_kind("permission_request"))
        prompt_seq = next(f["seq"] for f in frames if f.get("kind") == "user_message")
        request = frames[-1]["data"]["request"]
        self.socket.send({"type": "permission", "request": request, "option": option})
        self.socket.until(is_turn_end)
        changes = self.socket.until(of_kind("turn_changes"))[-1]
        assert changes["data"]["turn"] == prompt_seq
        return prompt_seq

    def revert(self, seq: int, **body: Any) -> tuple[int, dict[str, Any]]:
        return post(self.server, self.cookie, self.csrf, self.url(seq), body)

    def url(self, seq: int) -> str:
        return f"/api/sessions/{self.session.pk}/turns/{seq}/revert/"


def post(server: Daphne, cookie: str, csrf: str, path: str, body: Any) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Cookie": cookie, "X-CSRFToken": csrf, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as failed:
        with failed:
            return failed.status, json.loads(failed.read() or b"{}")


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "revert")


@pytest.fixture
def server(tmp_path):
    server = Daphne(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def person(server, owner, session):
    person = Person(server, owner, session)
    yield person
    person.socket.close()


def folder_of(session) -> Path:
    return Path(sandbox_services.workspace_path(session.sandbox, session.pk))


def test_a_turn_is_reverted_and_the_revert_is_reverted_in_turn(person, session):
    first = person.turn("write notes.txt hello")
    second = person.turn("write notes.txt goodbye")
    folder = folder_of(session)
    assert (folder / "notes.txt").read_text() == "goodbye"
    assert person.revert(second) == (204, {})
    reverted = person.socket.until(of_kind("workspace_reverted"))[-1]
    assert reverted["data"] == {
        "turn": second,
        "files": [
            {"path": "notes.txt", "status": "modified", "added": 1, "removed": 1, "binary": False}
        ],
        "truncated": False,
    }
    assert (folder / "notes.txt").read_text() == "hello"
    # A runner that starts afresh (another worker) knows the revert is the latest checkpoint.
    row = WorkspaceRevert.objects.get(session=session, seq=reverted["seq"])
    assert latest_checkpoint(session.pk) == row.checkpoint_after
    assert checkpoints_of(session.pk, reverted["seq"]) == (
        row.checkpoint_before,
        row.checkpoint_after,
    )
    # The revert is a change of its own: reverting it brings the second turn's file back.
    assert person.revert(reverted["seq"]) == (204, {})
    person.socket.until(of_kind("workspace_reverted"))
    assert (folder / "notes.txt").read_text() == "goodbye"
    # Back to before the first turn: the file did not exist.
    assert person.revert(first) == (204, {})
    undone = person.socket.until(of_kind("workspace_reverted"))[-1]
    assert [(f["path"], f["status"]) for f in undone["data"]["files"]] == [("notes.txt", "deleted")]
    assert not (folder / "notes.txt").exists()
    # The next turn's changes start from the reverted workspace, not from before the revert.
    person.turn("write notes.txt again")
    changes = [e for e in person.socket.events if e.get("kind") == "turn_changes"][-1]
    assert [(f["path"], f["status"]) for f in changes["data"]["files"]] == [("notes.txt", "added")]
    assert WorkspaceRevert.objects.filter(session=session).count() == 3


def test_a_revert_that_would_change_nothing_is_refused_and_stores_nothing(person, session):
    first = person.turn("write notes.txt hello")
    assert person.revert(first, path="notes.txt") == (204, {})
    person.socket.until(of_kind("workspace_reverted"))
    assert not (folder_of(session) / "notes.txt").exists()
    for again in ({"path": "notes.txt"}, {}):
        status, body = person.revert(first, **again)
        assert status == 409, again
        assert body["error"]["code"] == "nothing_to_revert"
    assert WorkspaceRevert.objects.filter(session=session).count() == 1
    # Changed again since, the same revert has something to do.
    person.turn("write notes.txt again")
    assert person.revert(first) == (204, {})
    person.socket.until(of_kind("workspace_reverted"))
    assert not (folder_of(session) / "notes.txt").exists()


def test_a_revert_whose_checkpoints_cannot_be_stored_leaves_no_event(person, session):
    """The event and the checkpoints that make it revertible are one transaction: the fault
    is a row that already holds the seq the revert's event would get."""
    turn = person.turn("write notes.txt hello")
    session.refresh_from_db()
    taken = session.last_seq + 1
    WorkspaceRevert.objects.create(
        session=session, seq=taken, checkpoint_before="0" * 40, checkpoint_after="0" * 40
    )
    status, body = person.revert(turn)
    assert status == 500 and body["error"]["code"] == "internal_error", (status, body)
    session.refresh_from_db()
    assert session.last_seq == taken - 1
    assert not session.events.filter(kind="workspace_reverted").exists()
    # The files were put back all the same; with the fault gone, a revert is stored whole.
    WorkspaceRevert.objects.filter(session=session).delete()
    assert person.revert(turn) == (204, {})
    reverted = person.socket.until(of_kind("workspace_reverted"))[-1]
    assert WorkspaceRevert.objects.filter(session=session, seq=reverted["seq"]).exists()


def test_one_file_of_a_turn_that_renamed_and_deleted_files_is_reverted(person, session):
    folder = folder_of(session)
    person.turn("write keep.txt kept")
    person.turn("write old.txt a file long enough for git to find it renamed, surely")
    renamed = person.turn("rename old.txt new.txt")
    deleted = person.turn("delete keep.txt")
    assert not (folder / "keep.txt").exists()
    # Reverting the rename file by file: new.txt goes back to its old name.
    assert person.revert(renamed, path="new.txt") == (204, {})
    data = person.socket.until(of_kind("workspace_reverted"))[-1]["data"]
    assert data["path"] == "new.txt"
    assert [(f["path"], f["status"], f.get("old_path")) for f in data["files"]] == [
        ("old.txt", "renamed", "new.txt")
    ]
    assert (folder / "old.txt").exists() and not (folder / "new.txt").exists()
    assert not (folder / "keep.txt").exists()  # the later turn's deletion stays
    assert person.revert(deleted, path="keep.txt") == (204, {})
    person.socket.until(of_kind("workspace_reverted"))
    assert (folder / "keep.txt").read_text() == "kept"


def test_a_hunk_is_reverted_and_one_that_no_longer_applies_is_refused(person, session):
    folder = folder_of(session)
    lines = [str(n) for n in range(1, 31)]
    person.turn("write f.txt " + "\n".join(lines) + "\n")
    lines[2], lines[24] = "three", "twenty-five"
    edited = person.turn("write f.txt " + "\n".join(lines) + "\n")
    assert person.revert(edited, path="f.txt", hunk=0) == (204, {})
    data = person.socket.until(of_kind("workspace_reverted"))[-1]["data"]
    assert data["hunk"] == 0 and data["path"] == "f.txt"
    text = (folder / "f.txt").read_text()
    assert "\n3\n" in text and "twenty-five" in text
    (folder / "f.txt").write_text("rewritten\n")
    status, answer = person.revert(edited, path="f.txt", hunk=1)
    assert (status, answer["error"]["code"]) == (409, "conflict")
    assert (folder / "f.txt").read_text() == "rewritten\n"
    status, answer = person.revert(edited, path="f.txt", hunk=9)
    assert (status, answer["error"]["code"]) == (400, "no_such_hunk")


def test_a_revert_is_refused_while_a_turn_runs_and_for_bad_requests(person, session):
    first = person.turn("write notes.txt hello")
    person.socket.send({"type": "prompt", "id": "running", "text": "write notes.txt bye"})
    request = person.socket.until(of_kind("permission_request"))[-1]["data"]["request"]
    status, answer = person.revert(first)
    assert (status, answer["error"]["code"]) == (409, "turn_running")
    assert (folder_of(session) / "notes.txt").read_text() == "hello"
    person.socket.send({"type": "permission", "request": request, "option": "reject"})
    person.socket.until(is_turn_end)
    status, answer = person.revert(10_000)
    assert (status, answer["error"]["code"]) == (404, "no_checkpoint")
    for body, code in [
        ({"path": "../etc/passwd"}, "invalid_path"),
        ({"path": "/etc/passwd"}, "invalid_path"),
        ({"path": "notes\x00.txt"}, "invalid_path"),
        ({"path": "notes\x1b.txt"}, "invalid_path"),
        ({"path": "notes\ud800.txt"}, "invalid_path"),
        ({"hunk": 0}, "invalid"),
        ({"path": "notes.txt", "hunk": -1}, "invalid"),
        ({"path": "notes.txt", "hunk": True}, "invalid"),
    ]:
        status, answer = person.revert(first, **body)
        assert (status, answer["error"]["code"]) == (400, code), body
    status, answer = post(person.server, person.cookie, person.csrf, person.url(first), [1])
    assert (status, answer["error"]["code"]) == (400, "bad_json")
    kinds = [e["kind"] for e in person.socket.events]
    assert "workspace_reverted" not in kinds


def test_only_the_owner_reverts(person, session, server, stranger):
    first = person.turn("write notes.txt hello")
    # The stranger's own cookie on the owner's session: as if there were no such session.
    stranger_cookie = f"{session_cookie(stranger)}; csrftoken={person.csrf}"
    status, answer = post(server, stranger_cookie, person.csrf, person.url(first), {})
    assert (status, answer["error"]["code"]) == (404, "not_found")
    status, answer = post(server, f"csrftoken={person.csrf}", person.csrf, person.url(first), {})
    assert (status, answer["error"]["code"]) == (401, "unauthenticated")
    status, _ = post(server, person.cookie, "wrong" * 8, person.url(first), {})
    assert status == 403  # no CSRF token, no revert
    assert (folder_of(session) / "notes.txt").read_text() == "hello"
