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
    mounts = {c: {m["name"]: m.get("readOnly", False) for m in containers[c]["volumeMounts"]}
              for c in containers}  # fmt: skip
    assert mounts[GIT_CONTAINER] == {"workspace": False, "git-stores": False}
    assert mounts["sandbox"]["git-stores"] is True


def test_the_network_policy_lets_named_hosts_through(settings, kube_backend):
    settings.CRAFT_K8S_EGRESS_ALLOWED = ["10.1.2.3/32"]
    egress = kube_backend.network_policy_manifest()["spec"]["egress"]
    assert egress[-1] == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]}
    settings.CRAFT_K8S_EGRESS_ALLOWED = []
    assert len(kube_backend.network_policy_manifest()["spec"]["egress"]) == 2


def test_a_remote_never_shows_its_token():
    remote = Remote("https://git.example.com/team/app.git", TOKEN)
    assert TOKEN not in repr(remote) and TOKEN not in str(remote)
