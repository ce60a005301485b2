"""A checkpoint's files copied into another session's workspace on the kubernetes backend (a
fork, docs/workspace.md): `export` from one session's store and `import` into the other's
workspace, two runs of the workspace tool through pod exec, against the test API server."""

from __future__ import annotations

import uuid

import pytest

from sandboxes import services
from sandboxes.backends.kubernetes import pod_name
from sandboxes.models import Sandbox

from .agents import run_turn
from .kube import NAMESPACE

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox(kube_backend, owner):
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    return sandbox


def test_a_checkpoints_files_are_copied_into_another_sessions_workspace_in_the_pod(sandbox, kube):
    source, fork = uuid.uuid4(), uuid.uuid4()
    connection = services.connect_agent(sandbox, source)
    run_turn(connection, "write notes/todo.txt ship it", answer="allow")
    run_turn(connection, "write run.sh echo hi", answer="allow")
    here = services.session_workspace(sandbox, source)
    commit = here.checkpoint("before the fork").commit
    run_turn(connection, "write notes/todo.txt changed since", answer="allow")

    tar = here.export(commit)
    try:
        there = services.writable_workspace(sandbox, fork)
        assert there.import_files(iter(tar.read, b""), 1 << 30) == {"files": 2, "bytes": 14}
    finally:
        tar.close()
    pod = kube.workspace(NAMESPACE, pod_name(sandbox)) / "sessions"
    assert (pod / str(fork) / "notes" / "todo.txt").read_text() == "ship it"
    assert (pod / str(fork) / "run.sh").read_text() == "echo hi"
    assert (pod / str(source) / "notes" / "todo.txt").read_text() == "changed since"
