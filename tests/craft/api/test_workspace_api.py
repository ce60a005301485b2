"""The files API through daphne: list, download one file, download all; owner only."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from craft import services as craft_services
from sandboxes import services as sandbox_services
from tests.ready import open_ready_session
from tests.server import Daphne, Socket

from ..wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def get(server: Daphne, user, path: str) -> tuple[int, dict[str, str], bytes]:
    headers = {} if user is None else {"Cookie": session_cookie(user)}
    request = urllib.request.Request(f"{server.url}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as failed:
        with failed:
            return failed.status, dict(failed.headers), failed.read()


@pytest.fixture
def session(owner):
    """A session whose agent has started (which creates the workspace), with some files."""
    session = open_ready_session(owner, "Files & things")
    sandbox_services.connect_agent(session.sandbox, session.pk)
    folder = Path(sandbox_services.workspace_path(session.sandbox, session.pk))
    (folder / "src").mkdir()
    (folder / "src" / "app.py").write_text("print('hi')\n")
    (folder / "page.html").write_text("<script>alert(document.cookie)</script>")
    (folder / "dot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / "passwd").symlink_to("/etc/passwd")
    return session


@pytest.fixture
def server(tmp_path, session):
    server = Daphne(tmp_path, CRAFT_ARCHIVE_MAX_BYTES="100000").start()
    yield server
    server.stop()


def test_the_owner_lists_folders(server, session, owner):
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/")
    assert status == 200
    listing = json.loads(body)
    assert [e["name"] for e in listing["entries"]] == [
        ".craft-demo-agent", "src", "dot.png", "page.html", "passwd"
    ]  # fmt: skip
    assert listing["total"] == 5 and listing["has_more"] is False
    link = listing["entries"][-1]
    assert link["type"] == "link" and link["target"] == "/etc/passwd"
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/?path=src&limit=1")
    assert json.loads(body)["entries"][0]["name"] == "app.py"
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/?path=nope")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/?path=passwd")
    assert status == 400 and json.loads(body)["error"]["code"] == "is_link"


def test_a_file_is_downloaded_never_shown_as_a_page_of_crafts_origin(server, session, owner):
    status, headers, body = get(
        server, owner, f"/api/sessions/{session.pk}/files/raw?path=page.html"
    )
    assert status == 200
    assert body == b"<script>alert(document.cookie)</script>"
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Disposition"].startswith('attachment; filename="page.html"')
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in headers["Content-Security-Policy"]
    status, headers, _ = get(server, owner, f"/api/sessions/{session.pk}/files/raw?path=dot.png")
    assert headers["Content-Type"] == "image/png"  # so that the page can preview it
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/raw?path=passwd")
    assert status == 400 and json.loads(body)["error"]["code"] == "not_a_file"


def test_a_file_over_the_limit_is_refused_before_a_byte_is_sent(server, session, owner):
    folder = Path(sandbox_services.workspace_path(session.sandbox, session.pk))
    (folder / "big.bin").write_bytes(b"x" * 200_000)
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/raw?path=big.bin")
    assert status == 413 and json.loads(body)["error"]["code"] == "too_large"
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/archive")
    assert status == 413 and json.loads(body)["error"]["code"] == "too_large"


def test_the_whole_workspace_downloads_as_a_zip(server, session, owner):
    status, headers, body = get(server, owner, f"/api/sessions/{session.pk}/archive")
    assert status == 200
    assert headers["Content-Type"] == "application/zip"
    assert f'filename="Files-things-{str(session.pk)[:8]}.zip"' in headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        assert archive.read("src/app.py") == b"print('hi')\n"
        assert archive.read("passwd") == b"/etc/passwd"


def test_only_the_owner_reaches_a_workspace(server, session, stranger):
    for path in ["files/", "files/raw?path=src/app.py", "archive", "turns/1/diff/"]:
        status, _, body = get(server, stranger, f"/api/sessions/{session.pk}/{path}")
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found", path
        status, _, body = get(server, None, f"/api/sessions/{session.pk}/{path}")
        assert status == 401 and json.loads(body)["error"]["code"] == "unauthenticated", path


def test_a_session_whose_agent_never_started_has_an_empty_workspace(server, owner):
    fresh = craft_services.open_session(owner, "new")
    status, _, body = get(server, owner, f"/api/sessions/{fresh.pk}/files/")
    assert status == 200 and json.loads(body)["entries"] == []
    status, _, body = get(server, owner, f"/api/sessions/{fresh.pk}/files/raw?path=x")
    assert status == 404 and json.loads(body)["error"]["code"] == "no_workspace"


def test_a_stopped_sandbox_answers_503(server, session, owner):
    sandbox_services.terminate_sandbox(session.sandbox)
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/")
    assert status == 503 and json.loads(body)["error"]["code"] == "sandbox_unavailable"


def test_a_turns_diff_is_gits_unified_diff_of_its_checkpoints(server, session, owner, stranger):
    sock = Socket(server, owner, session.pk)
    sock.send({"type": "resume", "after": sock.hello["last_seq"]})
    sock.send({"type": "prompt", "id": "w1", "text": "write notes.txt hello"})
    request = sock.until(lambda f: f.get("kind") == "permission_request")[-1]["data"]["request"]
    sock.send({"type": "permission", "request": request, "option": "allow"})
    sock.until(lambda f: f.get("kind") == "turn_changes")
    turn = next(f["seq"] for f in sock.events if f["kind"] == "user_message")
    sock.close()
    path = f"/api/sessions/{session.pk}/turns/{turn}/diff/"
    status, headers, body = get(server, owner, path)
    assert status == 200 and headers["Content-Type"] == "text/plain; charset=utf-8"
    assert "+++ b/notes.txt" in body.decode() and "+hello" in body.decode()
    # The files the fixture made before the turn were in the checkpoint before it: not here.
    assert "app.py" not in body.decode()
    status, _, body = get(server, owner, f"{path}?path=src/app.py")
    assert status == 200 and body == b""
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/turns/{turn + 1}/diff/")
    assert status == 404 and json.loads(body)["error"]["code"] == "no_checkpoint"  # not a turn
    status, _, body = get(server, stranger, path)
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


# What no path as Craft spells it holds: the tool spells a name's control characters \xNN.
CONTROL = ["a%00.png", "a%0Ab", "%1B%5B31m", "a%7F", "src%2F%09app.py"]


@pytest.mark.parametrize("endpoint", ["files/", "files/raw", "turns/1/diff/"])
def test_a_control_character_in_a_path_is_400_invalid_path(server, session, owner, endpoint):
    """A NUL cannot be in a program's argv: it was a 500 ("embedded null byte")."""
    for spelled in CONTROL:
        status, _, body = get(
            server, owner, f"/api/sessions/{session.pk}/{endpoint}?path={spelled}"
        )
        assert status == 400, (spelled, body)
        assert json.loads(body)["error"]["code"] == "invalid_path", spelled
    # Spelled as the tool spells it, a name with a line end is only not there.
    status, _, body = get(server, owner, f"/api/sessions/{session.pk}/files/raw?path=a%5Cx0ab")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
