"""The kubernetes backend against a real cluster: skipped unless CRAFT_TEST_KUBECONFIG is set.

Run it with a kubeconfig whose user may do what deploy/kubernetes/rbac.yaml grants, in a
namespace that exists, with the sandbox image pullable by the cluster:

    CRAFT_TEST_KUBECONFIG=~/.kube/config CRAFT_TEST_NAMESPACE=craft-sandboxes \\
    CRAFT_TEST_SANDBOX_IMAGE=registry.example.com/craft-sandbox:latest \\
    .venv/bin/pytest -m realcluster tests/sandboxes/backends/test_kubernetes_real_cluster.py
"""

from __future__ import annotations

import os
import uuid

import pytest

from sandboxes import services
from sandboxes.backends import forget_backends, get_backend
from sandboxes.models import Sandbox

from ..agents import reply_text, run_turn

KUBECONFIG = os.environ.get("CRAFT_TEST_KUBECONFIG", "")

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not KUBECONFIG, reason="needs a real cluster: set CRAFT_TEST_KUBECONFIG to run it"
    ),
]


@pytest.fixture
def cluster(settings):
    settings.CRAFT_SANDBOX_BACKEND = "kubernetes"
    settings.CRAFT_K8S_KUBECONFIG = os.path.expanduser(KUBECONFIG)
    settings.CRAFT_K8S_NAMESPACE = os.environ.get("CRAFT_TEST_NAMESPACE", "craft-sandboxes")
    settings.CRAFT_K8S_IMAGE = os.environ.get("CRAFT_TEST_SANDBOX_IMAGE", "craft-sandbox:latest")
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent"]
    forget_backends()
    yield
    forget_backends()


def test_a_sandbox_pod_runs_one_agent_for_several_prompts(cluster, owner):
    sandbox = services.provision_sandbox(owner)
    try:
        assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
        session_id = uuid.uuid4()
        connection = services.connect_agent(sandbox, session_id)
        first = reply_text(run_turn(connection, "pid", timeout=60))
        assert services.connect_agent(sandbox, session_id) is connection
        assert reply_text(run_turn(connection, "pid", timeout=60)) == first
        items = run_turn(connection, "write hello.txt from a real pod", answer="allow")
        assert "Wrote hello.txt." in reply_text(items)
        assert "from a real pod" in reply_text(run_turn(connection, "read hello.txt"))
        services.remove_session_workspace(sandbox, session_id)
        assert not connection.is_running
    finally:
        assert services.terminate_sandbox(sandbox).status == Sandbox.Status.TERMINATED


def test_a_sandbox_woken_on_its_claim_has_its_files_and_a_writable_home(cluster, owner):
    """The claim's folders (subPaths), made by the init container as the sandbox's user,
    are the pod's to write, and a new pod after sleep finds them as they were left."""
    backend = get_backend("kubernetes")
    sandbox = services.provision_sandbox(owner)
    try:
        assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
        session_id = uuid.uuid4()
        connection = services.connect_agent(sandbox, session_id)
        items = run_turn(connection, "write kept.txt on the claim", answer="allow", timeout=60)
        assert "Wrote kept.txt." in reply_text(items)
        home = backend.exec(sandbox, ["sh", "-c", 'echo memory > "$HOME/.craft-test"'])
        home.close_stdin()
        assert home.wait(60).exit_code == 0

        backend.sleep(sandbox)
        backend.provision(sandbox, lambda line: None)

        connection = services.connect_agent(sandbox, session_id)  # a new agent, a new pod
        assert "Read kept.txt" in reply_text(run_turn(connection, "read kept.txt", timeout=60))
        home = backend.exec(sandbox, ["sh", "-c", 'cat "$HOME/.craft-test"'])
        home.close_stdin()
        assert home.wait(60).stdout == b"memory\n"
    finally:
        assert services.terminate_sandbox(sandbox).status == Sandbox.Status.TERMINATED
