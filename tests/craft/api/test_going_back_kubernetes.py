"""Going back on the Kubernetes backend, against the test API server with the real
`kubernetes` client, through daphne: a fork's files and checkpoints come from its source's
store in the pod (the workspace tool's `fork`, by exec), and the fork is rewound to a turn
it copied. The pod's files are checked file by file."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from craft.models import Event, Session
from sandboxes.backends.kubernetes import pod_name
from sandboxes.in_sandbox import demo_agent

from ...server import Daphne, api
from ..test_sleeping import wait_for_status
from .test_going_back import Talker
from .test_revert import of_kind

pytestmark = pytest.mark.django_db(transaction=True)

NAMESPACE = "craft-going-back"


def files_in_pod(kube: Any, session: Session) -> dict[str, str]:
    """Every file of the session's workspace in its pod (but the demo agent's own state)."""
    folder = kube.workspace(NAMESPACE, pod_name(session.sandbox)) / "sessions" / str(session.pk)
    found = {}
    for path in Path(folder).rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and not relative.startswith(".craft-demo-agent"):
            found[relative] = path.read_text()
    return found


@pytest.fixture
def server(kube, kube_backend, tmp_path, settings):
    settings.CRAFT_K8S_NAMESPACE = NAMESPACE
    server = Daphne(
        tmp_path,
        CRAFT_SANDBOX_BACKEND="kubernetes",
        CRAFT_K8S_KUBECONFIG=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
        CRAFT_K8S_NAMESPACE=NAMESPACE,
        CRAFT_K8S_POLL_INTERVAL="0.05",
        CRAFT_K8S_READY_TIMEOUT="30",
        # The checkout's own file (`-m` would import the package the virtualenv points at).
        CRAFT_AGENT_COMMAND=f"{sys.executable} {demo_agent.__file__}",
        # The sandbox image's tools, as the test API server's pods see them (`kube_backend`).
        CRAFT_K8S_WORKSPACE_TOOL=shlex.join(settings.CRAFT_K8S_WORKSPACE_TOOL),
        CRAFT_K8S_GIT_TOOL=shlex.join(settings.CRAFT_K8S_GIT_TOOL),
    ).start()
    yield server
    server.stop()


def test_a_fork_in_a_pod_has_the_files_and_is_rewound_to_a_turn_it_copied(server, kube, owner):
    status, opened = api(server, owner, "POST", "/api/sessions/", {"title": "in a pod"})
    assert status == 201, opened
    wait_for_status(server, owner, "running")
    talker = Talker(server, owner, Session.objects.get(pk=opened["id"]))
    try:
        talker.turn("write notes.txt one")
        talker.turn("write notes.txt two")
        third = talker.turn("write later.txt later")
        status, answer = talker.fork(third)
        assert status == 201, answer
    finally:
        talker.socket.close()
    source = talker.session
    fork = Session.objects.get(pk=answer["id"])
    assert files_in_pod(kube, fork) == {"notes.txt": "two", "later.txt": "later"}

    prompts = list(
        Event.objects.filter(session=fork, kind="user_message")
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    forked = Talker(server, owner, fork)
    try:
        assert forked.rewind(prompts[0]) == (200, {"seq": prompts[0]})
        rewound = forked.socket.until(of_kind("rewound"))[-1]
        assert {(f["path"], f["status"]) for f in rewound["data"]["files"]} == {
            ("notes.txt", "modified"),
            ("later.txt", "deleted"),
        }
        assert files_in_pod(kube, fork) == {"notes.txt": "one"}
        forked.turn("write notes.txt forked")
    finally:
        forked.socket.close()
    assert files_in_pod(kube, fork) == {"notes.txt": "forked"}
    assert files_in_pod(kube, source) == {"notes.txt": "two", "later.txt": "later"}
