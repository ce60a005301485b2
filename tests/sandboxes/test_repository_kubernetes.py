"""A session on a repository on the Kubernetes backend, against the test API server (the
real kubernetes client, pod exec running on this machine) and a real git host."""

from __future__ import annotations

import base64

import pytest

from sandboxes import services
from sandboxes.backends.kubernetes import GIT_CONTAINER, GIT_STORES, pod_name
from sandboxes.repository import GitRefused, Remote
from tests.git_server import GitServer, git_server  # noqa: F401
from tests.ready import open_ready_session

from .kube import NAMESPACE, image_git_tool

TOKEN = "kubetoken-93b1c0d2e4f5"
BRANCH = "craft/on-kubernetes-9f8e"


@pytest.fixture
def pod_session(settings, kube, kube_backend, owner, tmp_path):
    settings.CRAFT_K8S_GIT_TOOL = image_git_tool(tmp_path / "image-git-tool")
    session = open_ready_session(owner, "repository")
    return session


def test_it_clones_commits_and_pushes_from_the_pod(kube, pod_session, git_server):  # noqa: F811
    host: GitServer = git_server
    url = host.create("team/app.git", {"a.txt": b"a\n"}, writers=(TOKEN,))
    remote = Remote(url, TOKEN, allow_http=True)
    sandbox = pod_session.sandbox
    repository = services.session_repository(sandbox, pod_session.pk)
    steps: list[dict] = []

    cloned = repository.clone(
        remote, base=None, branch_name=BRANCH, progress=steps.append, max_bytes=50 << 20,
        timeout=60,
    )  # fmt: skip

    pod = pod_name(sandbox)
    folder = kube.workspace(NAMESPACE, pod) / "sessions" / str(pod_session.pk)
    assert cloned.base == "main" and (folder / "a.txt").read_bytes() == b"a\n"
    assert steps
    (folder / "b.txt").write_bytes(b"b\n")
    commit = repository.commit("Add b", name="Olivia", email="olivia@example.com")
    assert repository.push(remote, BRANCH, timeout=60) == commit
    assert host.branches("team/app.git")[BRANCH] == commit
    assert repository.state("main").ahead == 1
    with pytest.raises(GitRefused) as refused:
        repository.commit("Again", name="Olivia", email="olivia@example.com")
    assert refused.value.code == "nothing_to_commit"

    # The token went to the git container on stdin only: no exec's command line holds it,
    # and the agent's container ran no step that had it.
    git_execs = [e for e in kube.execs if e.container == GIT_CONTAINER]
    assert git_execs and all(e.argv[-1] != "look" for e in git_execs)
    for record in kube.execs:
        assert TOKEN not in " ".join(record.argv)
        encoded = base64.b64encode(TOKEN.encode()).decode()
        assert encoded not in " ".join(record.argv)
    assert {e.container for e in kube.execs if "checkout" in e.argv} == {"sandbox"}
    assert {e.container for e in kube.execs if "push" in e.argv} == {GIT_CONTAINER}
    store = kube.volume_folder(NAMESPACE, pod, "git-stores") / str(pod_session.pk)
    for path in [*folder.rglob("*"), *store.rglob("*")]:
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN in host.tokens_seen()
    assert GIT_STORES == "/craft-git"


def test_the_pod_has_a_git_container_with_the_stores(kube_backend, owner):
    from sandboxes.models import Sandbox

    sandbox = Sandbox(owner=owner)
    spec = kube_backend.pod_manifest(sandbox)["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"sandbox", GIT_CONTAINER}
    assert not spec.get("shareProcessNamespace")
    # The stores are a folder of the sandbox's claim that only the git container writes.
    mounts = {c: {m["mountPath"]: (m.get("subPath"), m.get("readOnly", False))
                  for m in containers[c]["volumeMounts"]}
              for c in containers}  # fmt: skip
    assert mounts[GIT_CONTAINER] == {
        "/workspace": ("workspace", False),
        "/craft-git": ("git", False),
    }
    assert mounts["sandbox"]["/craft-git"] == ("git", True)


def test_the_network_policy_lets_named_hosts_through(settings, kube_backend):
    settings.CRAFT_K8S_EGRESS_ALLOWED = ["10.1.2.3/32"]
    egress = kube_backend.network_policy_manifest()["spec"]["egress"]
    assert egress[-1] == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]}
    settings.CRAFT_K8S_EGRESS_ALLOWED = []
    assert len(kube_backend.network_policy_manifest()["spec"]["egress"]) == 2


def test_a_remote_never_shows_its_token():
    remote = Remote("https://git.example.com/team/app.git", TOKEN)
    assert TOKEN not in repr(remote) and TOKEN not in str(remote)


def clone_into(pod_session, remote: Remote):
    repository = services.session_repository(pod_session.sandbox, pod_session.pk)
    repository.clone(
        remote, base=None, branch_name=BRANCH, progress=lambda step: None, max_bytes=50 << 20,
        timeout=60,
    )  # fmt: skip
    return repository


def test_in_the_pod_a_wrong_token_and_a_missing_repository_are_refused_plainly(
    kube,
    pod_session,
    git_server,  # noqa: F811
):
    url = git_server.create("team/app.git", writers=(TOKEN,))
    repository = services.session_repository(pod_session.sandbox, pod_session.pk)
    for remote, code in (
        (Remote(url, "wrong-token-0000", allow_http=True), "git_auth_failed"),
        (Remote(f"{git_server.url}/team/none.git", TOKEN, allow_http=True), "repository_not_found"),
    ):
        with pytest.raises(GitRefused) as refused:
            repository.clone(
                remote, base=None, branch_name=BRANCH, progress=lambda step: None,
                max_bytes=50 << 20, timeout=60,
            )  # fmt: skip
        assert refused.value.code == code, refused.value
    folder = kube.workspace(NAMESPACE, pod_name(pod_session.sandbox)) / "sessions"
    assert not any((folder / str(pod_session.pk)).glob("*"))


def test_in_the_pod_a_moved_branch_is_rejected_and_the_base_is_merged_with_conflicts(
    kube,
    pod_session,
    git_server,  # noqa: F811
):
    url = git_server.create("team/app.git", {"a.txt": b"one\n"}, writers=(TOKEN,))
    remote = Remote(url, TOKEN, allow_http=True)
    repository = clone_into(pod_session, remote)
    folder = kube.workspace(NAMESPACE, pod_name(pod_session.sandbox))
    folder = folder / "sessions" / str(pod_session.pk)
    (folder / "a.txt").write_bytes(b"mine\n")
    repository.commit("Mine", name="Olivia", email="olivia@example.com")
    repository.push(remote, BRANCH, timeout=60)
    theirs = git_server.commit("team/app.git", BRANCH, {"b.txt": b"b\n"}, "Someone else")
    git_server.commit("team/app.git", "main", {"a.txt": b"theirs\n"}, "Meanwhile on main")
    (folder / "c.txt").write_bytes(b"c\n")
    repository.commit("More", name="Olivia", email="olivia@example.com")
    with pytest.raises(GitRefused) as refused:
        repository.push(remote, BRANCH, timeout=60)
    assert refused.value.code == "push_rejected"
    assert git_server.branches("team/app.git")[BRANCH] == theirs  # never forced

    updated = repository.update(remote, "main", timeout=60)
    assert updated.conflicts == ["a.txt"]
    assert b"<<<<<<<" in (folder / "a.txt").read_bytes()


def test_in_the_pod_the_set_up_runs_in_the_workspace_and_says_how_it_ended(
    kube,
    pod_session,
    git_server,  # noqa: F811
):
    setup = b"#!/bin/sh\necho installing\ntouch .installed\necho broken >&2\nexit 3\n"
    url = git_server.create("team/app.git", {".craft/setup.sh": setup}, public=True)
    repository = clone_into(pod_session, Remote(url, allow_http=True))
    lines: list[str] = []

    run = repository.setup(None, timeout=60, output=lines.append)

    assert (run.ran, run.exit_code, run.timed_out) == (True, 3, False)
    assert "installing" in "".join(lines) and "broken" in run.tail
    folder = kube.workspace(NAMESPACE, pod_name(pod_session.sandbox))
    assert (folder / "sessions" / str(pod_session.pk) / ".installed").exists()
    assert {e.container for e in kube.execs if "setup.sh" in " ".join(e.argv)} == {"sandbox"}
