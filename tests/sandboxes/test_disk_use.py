"""Each sandbox's disk use is measured by the reaper, as the sandbox's own user, and shown.

The files are real (written into a sandbox's workspace and checkpoint store), and so is the
measure: `du` in a jail like the workspace tool's, as the sandbox's user, never as the
server's (a folder the sandbox's user cannot read is not counted, as the control shows).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.urls import reverse

from craft.session_activity import session_activity
from sandboxes import reaper, services
from sandboxes.models import Sandbox
from tests.ready import open_ready_session

from .hostile import contain, needs_root

pytestmark = [needs_root, pytest.mark.django_db(transaction=True)]

MiB = 1 << 20


def write_file(path: Path, size: int, uid: int) -> None:
    """Write `size` bytes of data (no sparse holes) into a file owned by `uid`."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    with open(path, "wb") as handle:
        for _ in range(size // MiB):
            handle.write(os.urandom(MiB))
    os.chown(path.parent, uid, uid)
    os.chown(path, uid, uid)


def test_the_reaper_measures_a_sandboxs_files_as_its_user_and_shows_them(
    settings, machine, owner, staff, client
):
    contain(settings, "on")
    session = open_ready_session(owner, "disk")
    services.connect_agent(session.sandbox, session.pk)  # makes its workspace
    services.session_workspace(session.sandbox, session.pk)  # and its checkpoint stores
    sandbox = Path(session.sandbox.reference)
    uid = sandbox.stat().st_uid
    write_file(sandbox / "sessions" / str(session.pk) / "data.bin", 3 * MiB, uid)
    stores = machine / "var" / "sandboxes" / ".craft" / "checkpoints" / str(session.sandbox_id)
    write_file(stores / str(session.pk) / "objects.bin", 2 * MiB, uid)
    # A folder of root's in the sandbox, which its user cannot read: measured as the server,
    # it would count.
    hidden = sandbox / "home" / "root-only"
    hidden.mkdir(mode=0o700)
    write_file(hidden / "secret.bin", 4 * MiB, 0)

    assert Sandbox.objects.get(pk=session.sandbox_id).disk_bytes is None
    reaper.reap_sandboxes(session_activity)
    measured = Sandbox.objects.get(pk=session.sandbox_id)
    assert 5 * MiB <= measured.disk_bytes < 6 * MiB  # the workspace and the store, not root's
    assert measured.disk_measured_at is not None

    client.force_login(owner)
    shown = client.get("/api/sandbox/").json()
    assert shown["disk_bytes"] == measured.disk_bytes
    assert shown["disk_limit_bytes"] == settings.CRAFT_SANDBOX_DISK
    assert shown["disk_measured_at"] == measured.disk_measured_at.isoformat()

    client.force_login(staff)
    changelist = client.get(reverse("admin:sandboxes_sandbox_changelist")).content.decode()
    assert "5." in changelist and "MiB" in changelist


def test_a_sandbox_is_measured_again_only_once_used_or_a_session_deleted(settings, machine, owner):
    contain(settings, "on")
    session = open_ready_session(owner, "disk")
    services.connect_agent(session.sandbox, session.pk)
    reaper.reap_sandboxes(session_activity)
    first = Sandbox.objects.get(pk=session.sandbox_id).disk_measured_at
    assert first is not None
    services.stop_idle_connections()  # no live agent keeps it in use

    reaper.reap_sandboxes(session_activity)
    assert Sandbox.objects.get(pk=session.sandbox_id).disk_measured_at == first  # not used

    services.remove_session_workspace(session.sandbox, session.pk)
    assert Sandbox.objects.get(pk=session.sandbox_id).disk_measured_at is None
    reaper.reap_sandboxes(session_activity)
    assert Sandbox.objects.get(pk=session.sandbox_id).disk_measured_at > first
