"""Uploads into a session's workspace (`PUT /api/sessions/<id>/files/raw?path=`): written by
the workspace tool with the agent's rights, as root in the jail as people run it, and on the
Kubernetes backend through pod exec; bodies over CRAFT_UPLOAD_MAX_BYTES refused by the server
before it reads them (through daphne)."""

from __future__ import annotations

import http.client
import os
from pathlib import Path

import pytest
from django.test import Client

from sandboxes import services as sandbox_services
from tests.ready import open_ready_session
from tests.sandboxes.hostile import contain, needs_root

from ...server import Daphne
from ..wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def put(client: Client, session_id, path: str, body: bytes, **query: str):
    extra = "".join(f"&{key}={value}" for key, value in query.items())
    return client.put(
        f"/api/sessions/{session_id}/files/raw?path={path}{extra}",
        body,
        content_type="application/octet-stream",
    )


def workspace_of(session) -> Path:
    return Path(sandbox_services.workspace_path(session.sandbox, session.pk))


@needs_root
def test_an_upload_lands_in_the_workspace_as_the_sandbox_user_and_is_never_clobbered(
    settings, machine, owner
):
    contain(settings, "on")
    session = open_ready_session(owner, "uploads")
    client = signed_in(owner)
    data = os.urandom(300_000)

    made = put(client, session.pk, "docs/data.bin", data)

    assert made.status_code == 201, made.content
    assert made.json() == {"path": "docs/data.bin", "size": len(data)}
    folder = workspace_of(session)
    written = folder / "docs" / "data.bin"
    assert written.read_bytes() == data
    owner_uid = folder.stat().st_uid
    assert owner_uid != os.getuid()
    assert written.stat().st_uid == owner_uid and (folder / "docs").stat().st_uid == owner_uid
    again = put(client, session.pk, "docs/data.bin", b"other")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "exists")
    assert written.read_bytes() == data
    replaced = put(client, session.pk, "docs/data.bin", b"other", overwrite="1")
    assert replaced.status_code == 201 and written.read_bytes() == b"other"
    assert sorted(p.name for p in (folder / "docs").iterdir()) == ["data.bin"]  # no leftovers


@needs_root
def test_an_upload_outside_the_workspace_or_through_a_link_is_refused(settings, machine, owner):
    contain(settings, "on")
    session = open_ready_session(owner, "uploads")
    client = signed_in(owner)
    put(client, session.pk, "first.txt", b"makes the workspace")
    folder = workspace_of(session)
    outside = Path(settings.VAR_DIR) / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)  # writable by anyone: only the path rule keeps it out
    (folder / "link").symlink_to(outside)
    for path, code in (
        ("../../escape.txt", "invalid_path"),
        ("link/escape.txt", "is_link"),
        ("", "invalid_path"),
        ("bad%01name", "invalid_path"),
    ):
        refused = put(client, session.pk, path, b"x")
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, code), path
    assert list(outside.iterdir()) == []


@needs_root
def test_a_file_over_the_limit_leaves_nothing(settings, machine, owner):
    contain(settings, "on")
    settings.CRAFT_UPLOAD_MAX_BYTES = 1000
    session = open_ready_session(owner, "uploads")
    client = signed_in(owner)

    refused = put(client, session.pk, "big.bin", b"x" * 5000)

    assert (refused.status_code, refused.json()["error"]["code"]) == (413, "too_large")
    assert list(workspace_of(session).iterdir()) == []


def test_another_persons_session_is_not_found(owner, stranger):
    session = open_ready_session(owner, "uploads")
    refused = put(signed_in(stranger), session.pk, "x.txt", b"x")
    assert refused.status_code == 404
    assert not (workspace_of(session) / "x.txt").exists()


def test_on_kubernetes_an_upload_is_written_in_the_pod(kube, kube_backend, owner):
    from sandboxes.backends.kubernetes import pod_name
    from tests.sandboxes.kube import NAMESPACE

    session = open_ready_session(owner, "uploads")
    made = put(signed_in(owner), session.pk, "in/pod.txt", b"hello pod")
    assert made.status_code == 201, made.content
    folder = kube.workspace(NAMESPACE, pod_name(session.sandbox)) / "sessions" / str(session.pk)
    assert (folder / "in" / "pod.txt").read_bytes() == b"hello pod"


def test_the_server_refuses_a_body_over_the_limit_without_a_view(tmp_path, owner):
    """Daphne receives a request's whole body before the application sees it (a proxy in
    front bounds that: docs/deployment.md); Craft then refuses one over the limit before
    Django spools it again or any view runs, whether its length was declared or not."""
    session = open_ready_session(owner, "uploads")
    cookie = session_cookie(owner)
    daphne = Daphne(tmp_path, CRAFT_UPLOAD_MAX_BYTES="1000").start()
    try:
        path = f"/api/sessions/{session.pk}/files/raw?path=big.bin"
        for chunked in (False, True):
            connection = http.client.HTTPConnection("127.0.0.1", daphne.port, timeout=10)
            body = [b"x" * 800, b"x" * 800] if chunked else b"x" * 1600
            connection.request("PUT", path, body=body, headers={"Cookie": cookie},
                               encode_chunked=chunked)  # fmt: skip
            answer = connection.getresponse()
            assert answer.status == 413, chunked
            assert b'"too_large"' in answer.read()
            connection.close()
    finally:
        daphne.stop()
    assert not (workspace_of(session) / "big.bin").exists()
