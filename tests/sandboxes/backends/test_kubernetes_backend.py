"""The kubernetes backend with the real `kubernetes` client against the test API server:
pods, Services and the NetworkPolicy, workspaces, the REST and exec ApiClients, and a chat in
a pod end to end.

The test server runs exec'd commands as local processes with the pod's /workspace mapped to
a folder. The exec transport itself is `test_kubernetes_exec.py`; what a session sees of its
agent connection, on this backend as on the local one, is `test_agent_connections.py`.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client as kubernetes
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from websocket import WebSocketException

from craft import services as craft_services
from sandboxes import services
from sandboxes.agent.connection import AgentConnection
from sandboxes.backends import containment
from sandboxes.backends.base import SandboxError
from sandboxes.backends.kubernetes import (
    CREDENTIALS,
    CREDENTIALS_AND_EXEC,
    NETWORK_POLICY,
    KubernetesBackend,
    claim_name,
    pod_name,
    secret_name,
)
from sandboxes.catalog import Agent, Credential, Launch
from sandboxes.models import Sandbox
from tests.ready import settled_sandbox

from ..agents import reply_text, run_turn
from ..kube import IMAGE_TOOLS, NAMESPACE, agent_execs

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS = Path(__file__).parent.parent.parent / "agents"


@pytest.fixture
def sandbox(kube_backend, owner):
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    return sandbox


def new_session(sandbox) -> uuid.UUID:
    return uuid.uuid4()  # its workspace is created at its agent's first start


def workspace(kube, sandbox, session_id):
    return kube.workspace(NAMESPACE, pod_name(sandbox)) / "sessions" / str(session_id)


# --- lifecycle ----------------------------------------------------------------------------


def test_provisioning_creates_a_locked_down_pod_and_a_service(sandbox, kube, settings):
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    pod = api.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    assert sandbox.reference == pod.metadata.name == f"craft-sandbox-{sandbox.id}"
    assert pod.metadata.labels["craft.dev/sandbox"] == str(sandbox.id)
    assert pod.metadata.labels["craft.dev/owner"] == str(sandbox.owner_id)
    assert pod.metadata.labels["app.kubernetes.io/name"] == "craft-sandbox"
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.automount_service_account_token is False
    # The agent's container, and Craft's git beside it (sandboxes/repository.py).
    container, git = pod.spec.containers
    assert (container.name, git.name) == ("sandbox", "git")
    for each in (container, git):
        assert each.security_context.capabilities.drop == ["ALL"]
        assert each.security_context.allow_privilege_escalation is False
    assert container.resources.limits == {
        "cpu": settings.CRAFT_K8S_CPU_LIMIT,
        "memory": settings.CRAFT_K8S_MEMORY_LIMIT,
    }
    service = api.read_namespaced_service(pod_name(sandbox), NAMESPACE)
    assert service.spec.selector == {"craft.dev/sandbox": str(sandbox.id)}


def test_the_pods_files_are_on_a_claim_of_the_sandboxs_own(kube_backend, sandbox, kube, settings):
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    pod = api.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    claim = api.read_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    assert claim.metadata.name == pod.metadata.name
    assert claim.metadata.labels == pod.metadata.labels  # the inventory's selector finds it
    assert claim.spec.access_modes == ["ReadWriteOnce"]
    assert claim.spec.resources.requests == {"storage": settings.CRAFT_K8S_WORKSPACE_SIZE}
    assert claim.spec.storage_class_name == "standard"  # none named: the cluster's default
    assert claim.status.phase == "Bound"
    # One volume from it, a folder of it per mount; no emptyDir is left.
    (data,) = [v for v in pod.spec.volumes if v.persistent_volume_claim is not None]
    assert data.persistent_volume_claim.claim_name == claim_name(sandbox)
    assert not [v for v in pod.spec.volumes if v.empty_dir is not None]
    container = pod.spec.containers[0]
    mounts = {m.mount_path: (m.sub_path, bool(m.read_only)) for m in container.volume_mounts}
    assert mounts["/workspace"] == ("workspace", False)
    assert mounts["/home/craft"] == ("home", False)
    assert mounts["/craft-git"] == ("git", True)
    (init,) = pod.spec.init_containers  # makes those folders as the sandbox's user
    assert init.security_context.capabilities.drop == ["ALL"]

    settings.CRAFT_K8S_STORAGE_CLASS = "fast-ssd"
    assert kube_backend.claim_manifest(sandbox)["spec"]["storageClassName"] == "fast-ssd"


def test_a_sleeping_sandbox_loses_its_pod_only_and_wakes_with_every_file(
    kube_backend, sandbox, kube
):
    session_id = new_session(sandbox)
    connection = services.connect_agent(sandbox, session_id)
    run_turn(connection, "write notes.txt kept", answer="allow")
    home = kube.folder(NAMESPACE, pod_name(sandbox), "/home/craft")
    (home / ".agent-memory").write_text("first turn")  # an agent's own files, in its home
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    uid = api.read_namespaced_pod(pod_name(sandbox), NAMESPACE).metadata.uid

    kube_backend.sleep(sandbox)
    kube_backend.sleep(sandbox)  # gone already: done

    with pytest.raises(ApiException) as gone:
        api.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    assert gone.value.status == 404
    api.read_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    api.read_namespaced_secret(secret_name(sandbox), NAMESPACE)
    api.read_namespaced_service(pod_name(sandbox), NAMESPACE)

    assert kube_backend.provision(sandbox, lambda line: None) == pod_name(sandbox)
    assert api.read_namespaced_pod(pod_name(sandbox), NAMESPACE).metadata.uid != uid
    assert (workspace(kube, sandbox, session_id) / "notes.txt").read_text() == "kept"
    process = kube_backend.exec(sandbox, ["sh", "-c", 'cat "$HOME/.agent-memory"'])
    process.close_stdin()
    assert process.wait(10).stdout == b"first turn"


def test_sandbox_pods_get_a_network_policy_before_they_exist(sandbox, kube, settings):
    api = kubernetes.NetworkingV1Api(kubernetes.ApiClient(kube.configuration()))
    policy = api.read_namespaced_network_policy(NETWORK_POLICY, NAMESPACE)
    pod = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration())).read_namespaced_pod(
        pod_name(sandbox), NAMESPACE
    )
    selector = policy.spec.pod_selector.match_labels
    assert selector.items() <= pod.metadata.labels.items()
    assert policy.spec.policy_types == ["Ingress", "Egress"]
    assert not policy.spec.ingress  # nothing may connect to a sandbox
    dns, everything = policy.spec.egress
    assert [p.port for p in dns.ports] == [53, 53]
    assert dns.to[0].pod_selector.match_labels == {"k8s-app": "kube-dns"}
    v4, v6 = (peer.ip_block for peer in everything.to)
    assert v4.cidr == "0.0.0.0/0"
    # Pods, services, the API server (kubernetes.default is 10.96.0.1 here) and cloud metadata.
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(v4._except)
    assert v6.cidr == "::/0" and "fc00::/7" in v6._except
    writes = [path for method, path in kube.requests if method == "POST"]
    assert writes.index(f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies") < (
        writes.index(f"/api/v1/namespaces/{NAMESPACE}/pods")
    )


def test_the_network_policy_is_shared_and_adopted(kube_backend, kube, owner, stranger):
    services.provision_sandbox(owner)
    KubernetesBackend(kube.configuration())._ensure_network_policy()  # another process: a 409
    services.provision_sandbox(stranger)
    assert list(kube.cluster.network_policies) == [(NAMESPACE, NETWORK_POLICY)]


def test_a_sandbox_does_not_start_without_its_network_policy(kube_backend, kube, owner):
    kube.rest_failures = 1
    failed = services.provision_sandbox(owner)
    assert failed.status == Sandbox.Status.FAILED
    assert "cannot create the network policy" in failed.error
    assert not kube.cluster.pods
    assert services.provision_sandbox(owner).status == Sandbox.Status.RUNNING


def test_provisioning_is_idempotent(kube_backend, kube, owner):
    sandbox = services.provision_sandbox(owner)
    # A second provision of the same sandbox meets 409s and adopts what exists.
    assert kube_backend.provision(sandbox, lambda line: None) == pod_name(sandbox)
    api = kube_backend.core
    pods = api.list_namespaced_pod(NAMESPACE, label_selector=f"craft.dev/sandbox={sandbox.id}")
    assert len(pods.items) == 1


def test_provisioning_waits_for_ready_and_reports_progress(kube_backend, kube, owner):
    kube.ready_delay = 0.6
    lines = []
    sandbox = Sandbox.objects.create(owner=owner, backend="kubernetes")
    started = time.monotonic()
    kube_backend.provision(sandbox, lines.append)
    assert time.monotonic() - started >= 0.6
    assert lines[0] == "creating pod"
    assert any(line.startswith("pod Pending") for line in lines)
    assert lines[-1] == "ready"


def test_image_pull_backoff_fails_fast_with_the_reason(kube_backend, kube, owner, settings):
    kube.image_pull_backoff = True
    # Far beyond the test's own timeout: only the pull's failure can end the wait in time.
    settings.CRAFT_K8S_READY_TIMEOUT = 3600
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.FAILED
    assert "ImagePull" in sandbox.error
    assert settings.CRAFT_K8S_IMAGE in sandbox.error


def test_an_unschedulable_pod_fails_fast_with_the_scheduler_message(
    kube_backend, kube, owner, settings
):
    kube.unschedulable = True
    settings.CRAFT_K8S_READY_TIMEOUT = 3600  # as above
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.FAILED
    assert "cannot be scheduled" in sandbox.error
    assert "Insufficient" in sandbox.error


def test_a_pod_that_never_gets_ready_times_out(kube_backend, kube, owner, settings):
    kube.never_ready = True
    settings.CRAFT_K8S_READY_TIMEOUT = 1
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.FAILED
    assert "not ready after 1 s" in sandbox.error


def test_rest_errors_while_provisioning_fail_clearly_and_can_be_retried(kube_backend, kube, owner):
    kube_backend._ensure_network_policy()  # so that the failure hits the sandbox's own
    kube.rest_failures = 1
    failed = services.provision_sandbox(owner)
    assert failed.status == Sandbox.Status.FAILED
    assert "cannot create the credentials secret" in failed.error
    assert "(500)" in failed.error
    retried = services.provision_sandbox(owner)
    assert retried.pk == failed.pk
    assert retried.status == Sandbox.Status.RUNNING


def test_terminate_deletes_each_resource_and_404_counts_as_done(sandbox, kube):
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    api.delete_namespaced_pod(pod_name(sandbox), NAMESPACE)  # already gone: fine
    terminated = services.terminate_sandbox(sandbox)
    assert terminated.status == Sandbox.Status.TERMINATED
    assert not kube.claim_folder(NAMESPACE, claim_name(sandbox)).exists()  # every file
    for read in (
        api.read_namespaced_pod,
        api.read_namespaced_service,
        api.read_namespaced_persistent_volume_claim,
    ):
        with pytest.raises(ApiException) as gone:
            read(pod_name(sandbox), NAMESPACE)
        assert gone.value.status == 404


def test_a_failing_terminate_leaves_the_sandbox_terminating_and_can_be_retried(sandbox, kube):
    kube.rest_failures = 2
    stuck = services.terminate_sandbox(sandbox)
    assert stuck.status == Sandbox.Status.TERMINATING
    assert "terminate failed" in stuck.error
    assert services.terminate_sandbox(stuck).status == Sandbox.Status.TERMINATED


def test_a_session_workspace_is_made_by_its_agents_start_and_removed_by_exec(sandbox, kube):
    session_id = new_session(sandbox)
    folder = workspace(kube, sandbox, session_id)
    assert not folder.exists()
    services.connect_agent(sandbox, session_id)
    assert folder.is_dir()
    (start,) = agent_execs(kube)  # the one exec makes the folder and starts the agent in it
    assert start.argv[:2] == ["sh", "-c"] and "mkdir -p" in start.argv[2]
    services.remove_session_workspace(sandbox, session_id)
    assert not folder.exists()
    assert kube.execs[-1].argv[:3] == ["rm", "-rf", "--"]


# --- REST and streaming clients -----------------------------------------------------------


def exec_while_rest_goes_on(rest, run_exec, kube, pod, seconds=3.0):
    """Run `run_exec()` over and over on 4 threads while this thread lists pods and reads
    `pod` through `rest`; return how many REST calls were made and the errors of both sides."""
    kube.exec_handshake_delay = 0.2  # widen the window in which stream() patches its client
    stop = threading.Event()
    exec_errors: list[BaseException] = []

    def exec_loop():
        while not stop.is_set():
            try:
                run_exec()
            except BaseException as exc:
                exec_errors.append(exc)

    threads = [threading.Thread(target=exec_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    # A REST call that went out as a websocket handshake fails with "Handshake status 200 OK":
    # wrapped in an ApiException by `stream()`, as websocket-client's own error by a transport
    # that swapped `call_api` to open its websocket itself (as Craft's once did).
    rest_errors: list[Exception] = []
    calls = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            rest.list_namespaced_pod(NAMESPACE)
            rest.read_namespaced_pod(pod, NAMESPACE)
        except (ApiException, WebSocketException) as exc:
            rest_errors.append(exc)
        calls += 2
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join(15)
    return calls, rest_errors, exec_errors


def backend_exec(backend, sandbox):
    """Return a function that runs `true` in the sandbox through the backend's exec."""

    def run():
        process = backend.exec(sandbox, ["true"])
        process.close_stdin()
        process.wait(10)

    return run


def test_rest_calls_during_overlapping_execs_do_not_fail(kube_backend, sandbox, kube):
    calls, rest_errors, exec_errors = exec_while_rest_goes_on(
        kube_backend.core, backend_exec(kube_backend, sandbox), kube, pod_name(sandbox)
    )
    assert calls > 50
    assert rest_errors == []
    assert exec_errors == []
    assert len(kube.execs) > 8


def test_execs_leave_the_api_client_they_are_given_alone(kube_backend, sandbox, kube):
    """Even one ApiClient for REST and every exec breaks nothing: the exec transport builds its
    request without `stream()` and its `call_api` swap (`exec_request`)."""
    shared = kubernetes.ApiClient(kube_backend.configuration)
    sharing = KubernetesBackend(
        kube_backend.configuration, rest_client=shared, exec_api_client=lambda: shared
    )
    calls, rest_errors, exec_errors = exec_while_rest_goes_on(
        sharing.core, backend_exec(sharing, sandbox), kube, pod_name(sandbox)
    )
    assert calls > 50
    assert rest_errors == []
    assert exec_errors == []


def test_stream_on_one_shared_api_client_reproduces_handshake_status_200(
    kube_backend, sandbox, kube
):
    """The bug the separate clients guard against (kubernetes-client/python #928), on purpose.

    If this test ever fails, the client's `stream()` no longer patches the ApiClient it is
    given; until then it proves that the tests above would see that bug.
    """
    shared = kubernetes.ApiClient(kube_backend.configuration)
    exec_api = kubernetes.CoreV1Api(shared)

    def run_exec():
        response = stream(
            exec_api.connect_get_namespaced_pod_exec,
            pod_name(sandbox),
            NAMESPACE,
            command=["true"],
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
        response.run_forever(timeout=10)
        response.close()
        # websocket-client leaves its socket open when the server closed first.
        response.sock.shutdown()

    _, rest_errors, _ = exec_while_rest_goes_on(
        kubernetes.CoreV1Api(shared), run_exec, kube, pod_name(sandbox)
    )
    assert rest_errors, "stream() on a shared ApiClient did not break REST calls"
    assert any("Handshake status 200" in str(exc) for exc in rest_errors)


# --- the live chat end to end --------------------------------------------------------------


def test_a_session_on_kubernetes_gets_its_workspace_in_the_pod(kube_backend, kube, owner):
    session = craft_services.open_session(owner, "on kubernetes")
    assert session.sandbox.backend == "kubernetes"
    sandbox = settled_sandbox(session.sandbox_id)
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    connection = services.connect_agent(sandbox, session.pk)
    assert workspace(kube, sandbox, session.pk).is_dir()
    assert connection.cwd == f"/workspace/sessions/{session.pk}"


# --- the sandbox image's tools (deploy/sandbox-image) -----------------------------------------

IMAGE = Path(__file__).resolve().parents[3] / "deploy" / "sandbox-image"


def test_pods_run_the_workspace_tool_as_the_images_compiled_module():
    """The default command imports the tool from the image's /opt/craft, where the image wrote
    its bytecode, rather than running it as a script (compiled at every listing). Every other
    kubernetes test runs this form, with /opt/craft laid out in a folder of its own
    (`image_workspace_tool`)."""
    from craft import settings as defaults

    command = defaults.CRAFT_K8S_WORKSPACE_TOOL
    assert command == containment.module_command("python3", IMAGE_TOOLS, "workspace_tool")


def test_the_images_demo_agent_runs_its_compiled_module_with_its_arguments(tmp_path):
    """The image's `craft-demo-agent` wrapper, with /opt/craft laid out in a folder (as
    `containment.install_demo_agent` lays it out: the source and its bytecode)."""
    tools = tmp_path / "opt-craft"
    containment.install_demo_agent(tools, sys.executable)
    wrapper = (IMAGE / "craft-demo-agent").read_text()
    assert str(IMAGE_TOOLS) in wrapper and wrapper.count("exec python3 ") == 1
    local = tmp_path / "craft-demo-agent"
    local.write_text(
        wrapper.replace(str(IMAGE_TOOLS), str(tools)).replace(
            "exec python3 ", f"exec {sys.executable} "
        )
    )
    local.chmod(0o755)
    result = subprocess.run([local, "--version"], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "craft-demo-agent 1.2.0", result.stderr


def test_an_agent_connection_reads_and_writes_in_the_pod_workspace(sandbox, kube):
    session_id = new_session(sandbox)
    connection: AgentConnection = services.connect_agent(sandbox, session_id)
    items = run_turn(connection, "write notes/todo.txt ship it", answer="allow")
    assert "Wrote notes/todo.txt." in reply_text(items)
    assert (workspace(kube, sandbox, session_id) / "notes" / "todo.txt").read_text() == "ship it"
    assert connection.cwd == f"/workspace/sessions/{session_id}"


# --- credentials ------------------------------------------------------------------------


def keyed_launch(values: dict[str, str]) -> Launch:
    agent = Agent(
        id="keyed",
        title="Keyed agent",
        command=[sys.executable, str(AGENTS / "env_agent.py")],
        credentials=tuple(Credential(name, name) for name in values),
    )
    return Launch(agent, values)


def test_the_pod_mounts_the_sandboxs_credentials_secret(sandbox, kube):
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    secret = api.read_namespaced_secret(secret_name(sandbox), NAMESPACE)
    assert secret.metadata.labels["craft.dev/sandbox"] == str(sandbox.id)
    assert not secret.data  # made before the pod, empty until an agent needs a key
    pod = api.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    (volume,) = [v for v in pod.spec.volumes if v.secret is not None]
    assert volume.secret.secret_name == secret_name(sandbox)
    (mount,) = [m for m in pod.spec.containers[0].volume_mounts if m.name == volume.name]
    assert mount.mount_path == CREDENTIALS and mount.read_only
    assert "env" not in pod.to_dict()["spec"]["containers"][0] or not pod.spec.containers[0].env


def test_an_agent_reads_its_key_from_the_secret_and_the_exec_never_carries_it(
    sandbox, kube, caplog
):
    key = "sk-pod-0123456789-secret"
    launch = keyed_launch({"PROVIDER_API_KEY": key})
    connection = services.connect_agent(sandbox, new_session(sandbox), launch=launch)
    env = json.loads(reply_text(run_turn(connection, "env")))
    assert env["PROVIDER_API_KEY"] == key

    # Written to stderr by the agent, it reaches Craft's log redacted.
    caplog.set_level("INFO", logger="craft.agent.stderr")
    run_turn(connection, "leak")
    deadline = time.monotonic() + 10
    while "PROVIDER_API_KEY=[redacted]" not in caplog.text:
        assert time.monotonic() < deadline, caplog.text[-2000:]
        time.sleep(0.05)
    assert key not in caplog.text

    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    secret = api.read_namespaced_secret(secret_name(sandbox), NAMESPACE)
    assert base64.b64decode(secret.data["PROVIDER_API_KEY"]).decode() == key
    start = next(e for e in kube.execs if any("env_agent.py" in a for a in e.argv))
    assert not any(key in arg for arg in start.argv)  # the exec URL is made of the argv
    assert any(arg.startswith("PROVIDER_API_KEY=") for arg in start.argv)  # name=revision
    assert key not in json.dumps(sandbox_pod(api, sandbox), default=str)

    # A new value reaches the next agent; the old one is gone from the Secret.
    services.stop_idle_connections(sandbox)
    launch = keyed_launch({"PROVIDER_API_KEY": "sk-replaced-key-000000"})
    connection = services.connect_agent(sandbox, new_session(sandbox), launch=launch)
    env = json.loads(reply_text(run_turn(connection, "env")))
    assert env["PROVIDER_API_KEY"] == "sk-replaced-key-000000"


def sandbox_pod(api, sandbox) -> dict:
    return api.read_namespaced_pod(pod_name(sandbox), NAMESPACE).to_dict()


def test_an_agent_whose_key_has_not_reached_the_pod_says_so(kube_backend, sandbox):
    # The kubelet refreshes a mounted Secret a minute or so after it changes: until the
    # revision the start asks for is there, the agent does not start, and says why.
    argv = ["sh", "-c", CREDENTIALS_AND_EXEC, "sh", "/workspace/sessions/x", CREDENTIALS, "1"]
    process = kube_backend.exec(sandbox, [*argv, "X_KEY=not-there-yet", "--", "true"])
    result = process.wait(30)
    assert result.exit_code == 75
    assert "X_KEY has not reached the sandbox yet" in result.stderr


def test_terminate_deletes_the_credentials_secret(sandbox, kube):
    services.connect_agent(
        sandbox, new_session(sandbox), launch=keyed_launch({"PROVIDER_API_KEY": "sk-x-123456789"})
    )
    services.terminate_sandbox(sandbox)
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    with pytest.raises(ApiException) as gone:
        api.read_namespaced_secret(secret_name(sandbox), NAMESPACE)
    assert gone.value.status == 404


def test_a_claim_being_deleted_is_waited_for_and_made_anew(kube_backend, sandbox, kube, settings):
    # Its pod keeps it (pvc-protection) after its deletion: a pod cannot mount it meanwhile.
    core = kube_backend.core
    core.delete_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    old = core.read_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    assert old.metadata.deletion_timestamp is not None
    settings.CRAFT_K8S_READY_TIMEOUT = 0.3
    lines: list[str] = []
    with pytest.raises(SandboxError, match="still being deleted"):
        kube_backend.provision(sandbox, lines.append)
    assert "waiting for the previous volume claim to be deleted" in lines

    kube_backend.sleep(sandbox)  # its last pod goes: so does the claim
    settings.CRAFT_K8S_READY_TIMEOUT = 10
    kube_backend.provision(sandbox, lines.append)
    new = core.read_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    assert new.metadata.uid != old.metadata.uid and new.metadata.deletion_timestamp is None
