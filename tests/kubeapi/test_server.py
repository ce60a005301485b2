"""The test API server, exercised only through the official `kubernetes` client.

These tests pin down what the sandbox backend's tests rely on: the REST shapes deserialise into
the client's models, errors raise ApiException with the right status, pods move along their
timelines, and exec streams behave like a kubelet's. What the server does not model (watches,
discovery, older exec protocols...) is refused or answered 404, never half-done.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import WSClient

from tests.kubeapi import KubeTestServer
from tests.kubeapi.objects import parse_go_bool
from tests.procs import alive

NS = "craft-test"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KubeTestServer]:
    with KubeTestServer(tmp_path / "pods") as srv:
        srv.ready_delay = 0.05
        yield srv


@pytest.fixture
def api(server: KubeTestServer) -> Iterator[client.CoreV1Api]:
    api_client = client.ApiClient(server.configuration())
    yield client.CoreV1Api(api_client)
    api_client.close()


def pod_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def is_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@pytest.fixture
def pod(api: client.CoreV1Api) -> str:
    """A Running, Ready pod named `box`."""
    api.create_namespaced_pod(NS, pod_body("box"))
    wait_for(lambda: is_ready(api.read_namespaced_pod("box", NS)))
    return "box"


def open_exec(
    api: client.CoreV1Api, pod: str, command: list[str], *, stdin: bool = False, **kwargs: Any
) -> WSClient:
    return stream(
        api.connect_get_namespaced_pod_exec,
        pod,
        NS,
        command=command,
        stdin=stdin,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        **kwargs,
    )


RunExec = Callable[..., WSClient]


@pytest.fixture
def run_exec(api: client.CoreV1Api) -> Iterator[RunExec]:
    """Open exec streams like `open_exec`, closing their sockets when the test ends."""
    opened: list[WSClient] = []

    def run(pod: str, command: list[str], **kwargs: Any) -> WSClient:
        resp = open_exec(api, pod, command, **kwargs)
        opened.append(resp)
        return resp

    yield run
    for resp in opened:
        close_exec(resp)


def close_exec(resp: WSClient) -> None:
    resp.close()
    # websocket-client skips closing its socket when the server closed the websocket first
    # (it only answers the close frame), so release the socket explicitly.
    if resp.sock is not None:
        resp.sock.shutdown()


def body_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


# -- configuration --------------------------------------------------------------


def test_kubeconfig_is_usable(server: KubeTestServer, tmp_path: Path) -> None:
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = config.new_client_from_config(config_file=str(path))
    try:
        assert api_client.configuration.host == server.url
        assert client.CoreV1Api(api_client).list_namespaced_pod(NS).items == []
    finally:
        api_client.close()


# -- pods -------------------------------------------------------------------------------------


def test_pod_create_get_list_delete(api: client.CoreV1Api) -> None:
    created = api.create_namespaced_pod(NS, pod_body("web", {"app": "web", "tier": "front"}))
    api.create_namespaced_pod(NS, pod_body("db", {"app": "db"}))
    api.create_namespaced_pod("elsewhere", pod_body("web", {"app": "web"}))
    assert created.metadata.uid
    assert created.metadata.namespace == NS
    assert created.status.phase == "Pending"

    fetched = api.read_namespaced_pod("web", NS)
    assert fetched.metadata.uid == created.metadata.uid
    assert fetched.spec.containers[0].image == "busybox:1.36"

    def names(**selectors: str) -> list[str]:
        return [p.metadata.name for p in api.list_namespaced_pod(NS, **selectors).items]

    assert names() == ["db", "web"]
    assert names(label_selector="app=web,tier=front") == ["web"]
    assert names(label_selector="app=db") == ["db"]
    assert [p.metadata.name for p in api.list_namespaced_pod("elsewhere").items] == ["web"]

    deleted = api.delete_namespaced_pod("web", NS, grace_period_seconds=0)
    assert deleted.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("web", NS)
    assert missing.value.status == 404
    assert names() == ["db"]


def test_conflicts_and_missing_objects(api: client.CoreV1Api) -> None:
    api.create_namespaced_pod(NS, pod_body("dup"))
    with pytest.raises(ApiException) as conflict:
        api.create_namespaced_pod(NS, pod_body("dup"))
    assert conflict.value.status == 409
    assert body_of(conflict.value)["reason"] == "AlreadyExists"

    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("ghost", NS)
    assert missing.value.status == 404
    assert body_of(missing.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "ghost" not found',
        "reason": "NotFound",
        "details": {"name": "ghost", "kind": "pods"},
        "code": 404,
    }
    with pytest.raises(ApiException) as delete_missing:
        api.delete_namespaced_pod("ghost", NS)
    assert delete_missing.value.status == 404

    nameless = pod_body("x")
    del nameless["metadata"]["name"]
    with pytest.raises(ApiException) as unnamed:
        api.create_namespaced_pod(NS, nameless)
    assert unnamed.value.status == 422
    assert body_of(unnamed.value)["reason"] == "Invalid"


def test_unknown_path_is_a_404_status(server: KubeTestServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(server.url + "/api/v1/widgets")
    with error.value:
        assert error.value.code == 404
        assert json.loads(error.value.read())["kind"] == "Status"


def test_pod_becomes_ready_after_the_delay(server: KubeTestServer, api: client.CoreV1Api) -> None:
    server.ready_delay = 0.3
    start = time.monotonic()
    api.create_namespaced_pod(NS, pod_body("slow"))
    first = api.read_namespaced_pod("slow", NS)
    assert first.status.phase == "Pending" and not is_ready(first)

    ready = wait_for(lambda: (p := api.read_namespaced_pod("slow", NS)) and is_ready(p) and p)
    assert time.monotonic() - start >= 0.3
    assert ready.status.phase == "Running"
    conditions = {c.type: c.status for c in ready.status.conditions}
    assert all(
        conditions[t] == "True" for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    )
    (container,) = ready.status.container_statuses
    assert container.ready and container.state.running is not None
    reasons = [
        e.reason
        for e in api.list_namespaced_event(
            NS, field_selector="involvedObject.name=slow,involvedObject.kind=Pod"
        ).items
    ]
    assert reasons == ["Scheduled", "Pulling", "Pulled", "Created", "Started"]


def test_never_ready(server: KubeTestServer, api: client.CoreV1Api) -> None:
    server.never_ready = True
    api.create_namespaced_pod(NS, pod_body("stuck"))
    running = wait_for(
        lambda: (p := api.read_namespaced_pod("stuck", NS)).status.phase == "Running" and p
    )
    time.sleep(0.1)
    assert not is_ready(api.read_namespaced_pod("stuck", NS))
    assert running.status.container_statuses[0].ready is False


def test_image_pull_backoff(server: KubeTestServer, api: client.CoreV1Api) -> None:
    server.image_pull_backoff = True
    api.create_namespaced_pod(NS, pod_body("badimage"))
    server.image_pull_backoff = False  # only pods created while the switch was on fail

    def waiting_reason() -> str:
        state = api.read_namespaced_pod("badimage", NS).status.container_statuses[0].state
        return state.waiting.reason if state.waiting else ""

    wait_for(lambda: waiting_reason() == "ErrImagePull")
    wait_for(lambda: waiting_reason() == "ImagePullBackOff")
    pod = api.read_namespaced_pod("badimage", NS)
    assert pod.status.phase == "Pending"
    assert "Back-off pulling image" in pod.status.container_statuses[0].state.waiting.message
    events = api.list_namespaced_event(NS, field_selector="involvedObject.name=badimage").items
    warnings = {(e.reason, e.type) for e in events if e.type == "Warning"}
    assert ("Failed", "Warning") in warnings
    assert any(e.reason == "BackOff" for e in events)
    assert any("ErrImagePull" in e.message for e in events)


def test_unschedulable(server: KubeTestServer, api: client.CoreV1Api) -> None:
    server.unschedulable = True
    api.create_namespaced_pod(NS, pod_body("huge"))
    time.sleep(0.1)
    pod = api.read_namespaced_pod("huge", NS)
    assert pod.status.phase == "Pending"
    (scheduled,) = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert "Insufficient cpu" in scheduled.message
    (event,) = api.list_namespaced_event(NS, field_selector="involvedObject.name=huge").items
    assert (event.reason, event.type) == ("FailedScheduling", "Warning")
    assert event.involved_object.kind == "Pod" and event.count == 1


def test_rest_failures_then_recovery(server: KubeTestServer, api: client.CoreV1Api) -> None:
    server.rest_failures = 2
    for _ in range(2):
        with pytest.raises(ApiException) as failure:
            api.list_namespaced_pod(NS)
        assert failure.value.status == 500
        assert body_of(failure.value)["reason"] == "InternalError"
    assert api.list_namespaced_pod(NS).items == []
    assert server.rest_failures == 0


def test_what_is_not_modelled_is_refused_not_half_done(api: client.CoreV1Api) -> None:
    for unmodelled in (
        {"label_selector": "app!=web"},
        {"label_selector": "canary"},
        {"field_selector": "metadata.name=web"},
        {"watch": True},
    ):
        with pytest.raises(ApiException) as refused:
            api.list_namespaced_pod(NS, **unmodelled)
        assert refused.value.status == 400, unmodelled


# -- services ---------------------------------------------------------------------------------


def test_services(api: client.CoreV1Api) -> None:
    body = {
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    created = api.create_namespaced_service(NS, body)
    assert created.spec.selector == {"app": "web"}
    with pytest.raises(ApiException) as conflict:
        api.create_namespaced_service(NS, body)
    assert conflict.value.status == 409
    assert api.read_namespaced_service("web", NS).metadata.uid == created.metadata.uid
    listed = api.list_namespaced_service(NS, label_selector="app=web").items
    assert [s.metadata.name for s in listed] == ["web"]
    api.delete_namespaced_service("web", NS)
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_service("web", NS)
    assert missing.value.status == 404
    with pytest.raises(ApiException) as delete_missing:
        api.delete_namespaced_service("web", NS)
    assert delete_missing.value.status == 404


# -- persistent volume claims -------------------------------------------------------------------


def claim_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def pod_on_claim(name: str, claim: str) -> dict[str, Any]:
    """A pod whose `/workspace` and `/home/craft` are folders of `claim`, with a scratch
    `emptyDir` at `/scratch`."""
    body = pod_body(name)
    body["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/workspace", "subPath": "workspace"},
        {"name": "data", "mountPath": "/home/craft", "subPath": "home"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    body["spec"]["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
        {"name": "scratch", "emptyDir": {}},
    ]
    return body


def run(run_exec: RunExec, pod: str, script: str) -> str:
    resp = run_exec(pod, ["sh", "-c", script, "sh", "/workspace", "/scratch"])
    resp.run_forever(timeout=5)
    assert resp.returncode == 0, resp.read_stderr()
    return resp.read_stdout()


def test_claims_create_get_list_relabel_delete(api: client.CoreV1Api) -> None:
    created = api.create_namespaced_persistent_volume_claim(NS, claim_body("data", {"a": "1"}))
    assert created.status.phase == "Pending"  # WaitForFirstConsumer: no pod uses it yet
    assert created.spec.storage_class_name == "standard"  # the cluster's default class
    with pytest.raises(ApiException) as conflict:
        api.create_namespaced_persistent_volume_claim(NS, claim_body("data"))
    assert conflict.value.status == 409 and body_of(conflict.value)["reason"] == "AlreadyExists"
    api.create_namespaced_persistent_volume_claim(NS, claim_body("other"))
    listed = api.list_namespaced_persistent_volume_claim(NS, label_selector="a=1").items
    assert [c.metadata.name for c in listed] == ["data"]
    patched = api.patch_namespaced_persistent_volume_claim(
        "data",
        NS,
        [{"op": "add", "path": "/metadata/labels", "value": {"b": "2"}}],
        _content_type="application/json-patch+json",
    )
    assert patched.metadata.labels == {"b": "2"}
    api.delete_namespaced_persistent_volume_claim("data", NS)
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_persistent_volume_claim("data", NS)
    assert missing.value.status == 404


def test_a_claim_is_bound_when_its_first_pod_is_scheduled(
    server: KubeTestServer, api: client.CoreV1Api
) -> None:
    api.create_namespaced_persistent_volume_claim(NS, claim_body("data"))
    api.create_namespaced_pod(NS, pod_on_claim("box", "data"))
    wait_for(lambda: is_ready(api.read_namespaced_pod("box", NS)))
    claim = api.read_namespaced_persistent_volume_claim("data", NS)
    assert claim.status.phase == "Bound"
    assert claim.spec.volume_name == f"pvc-{claim.metadata.uid}"
    assert claim.status.capacity == {"storage": "1Gi"}


def test_a_pod_on_a_missing_claim_waits_for_it_as_a_scheduler_does(
    server: KubeTestServer, api: client.CoreV1Api
) -> None:
    api.create_namespaced_pod(NS, pod_on_claim("box", "data"))
    time.sleep(0.2)
    pod = api.read_namespaced_pod("box", NS)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    (condition,) = pod.status.conditions
    assert (condition.type, condition.reason) == ("PodScheduled", "Unschedulable")
    events = api.list_namespaced_event(NS, field_selector="involvedObject.name=box").items
    assert [e.reason for e in events] == ["FailedScheduling"]
    assert 'persistentvolumeclaim "data" not found' in events[0].message

    api.create_namespaced_persistent_volume_claim(NS, claim_body("data"))
    wait_for(lambda: is_ready(api.read_namespaced_pod("box", NS)))
    assert api.read_namespaced_persistent_volume_claim("data", NS).status.phase == "Bound"


def test_a_claims_files_outlive_its_pods_and_an_empty_dirs_do_not(
    server: KubeTestServer, api: client.CoreV1Api, run_exec: RunExec
) -> None:
    api.create_namespaced_persistent_volume_claim(NS, claim_body("data"))
    api.create_namespaced_pod(NS, pod_on_claim("box", "data"))
    wait_for(lambda: is_ready(api.read_namespaced_pod("box", NS)))
    out = run(
        run_exec, "box", 'echo kept > "$1/notes"; echo gone > "$2/tmp"; echo memory > ~/m; pwd'
    )
    folder = server.claim_folder(NS, "data")
    assert out == f"{folder / 'workspace'}\n"  # /workspace is the claim's subPath
    assert (folder / "home" / "m").read_text() == "memory\n"  # HOME: the image's home
    scratch = server.folder(NS, "box", "/scratch")
    assert (scratch / "tmp").is_file()

    api.delete_namespaced_pod("box", NS)
    assert not scratch.exists()  # an emptyDir goes with its pod
    api.create_namespaced_pod(NS, pod_on_claim("box", "data"))  # a new pod, the same claim
    wait_for(lambda: is_ready(api.read_namespaced_pod("box", NS)))
    assert run(run_exec, "box", 'cat "$1/notes" ~/m; ls "$2"') == "kept\nmemory\n"


def test_a_claim_in_use_stays_until_its_last_pod_goes(
    server: KubeTestServer, api: client.CoreV1Api
) -> None:
    api.create_namespaced_persistent_volume_claim(NS, claim_body("data"))
    api.create_namespaced_pod(NS, pod_on_claim("box", "data"))
    wait_for(lambda: is_ready(api.read_namespaced_pod("box", NS)))
    (server.workspace(NS, "box") / "f").write_text("x")

    api.delete_namespaced_persistent_volume_claim("data", NS)
    claim = api.read_namespaced_persistent_volume_claim("data", NS)
    assert claim.metadata.deletion_timestamp is not None
    assert claim.metadata.finalizers == ["kubernetes.io/pvc-protection"]
    assert (server.claim_folder(NS, "data") / "workspace" / "f").exists()
    # A new pod cannot have it meanwhile.
    api.create_namespaced_pod(NS, pod_on_claim("other", "data"))
    time.sleep(0.1)
    assert api.read_namespaced_pod("other", NS).status.phase == "Pending"

    api.delete_namespaced_pod("box", NS)
    assert api.read_namespaced_persistent_volume_claim("data", NS)  # "other" names it too
    api.delete_namespaced_pod("other", NS)
    with pytest.raises(ApiException) as gone:
        api.read_namespaced_persistent_volume_claim("data", NS)
    assert gone.value.status == 404
    assert not server.claim_folder(NS, "data").exists()  # its data went with it


# -- schemas ----------------------------------------------------------------------------------


def send(server: KubeTestServer, method: str, path: str, body: Any, kind: str) -> tuple:
    """Send `body` as JSON, as a client that checks nothing would; return (code, Status)."""
    request = urllib.request.Request(
        f"{server.url}/api/v1/namespaces/{NS}/{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": kind},
    )
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def test_objects_that_break_the_published_schemas_are_refused_as_invalid(
    server: KubeTestServer, api: client.CoreV1Api
) -> None:
    unknown = pod_body("box")
    unknown["spec"]["containers"][0]["volumeMount"] = []  # a typo of volumeMounts
    wrong_type = claim_body("data")
    wrong_type["spec"]["accessModes"] = "ReadWriteOnce"
    missing = {"metadata": {"name": "web"}, "spec": {"ports": [{"name": "http"}]}}
    for path, body, field in (
        ("pods", unknown, "spec.containers[0]"),
        ("persistentvolumeclaims", wrong_type, "spec.accessModes"),
        ("services", missing, "spec.ports[0]"),
    ):
        code, status = send(server, "POST", path, body, "application/json")
        assert (code, status["reason"]) == (422, "Invalid"), status
        (cause,) = status["details"]["causes"]
        assert cause["field"] == field, cause
    assert api.list_namespaced_pod(NS).items == []
    # A patch's result is checked too: label values are strings.
    api.create_namespaced_pod(NS, pod_body("box"))
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"a": ["not", "a", "string"]}}]
    code, status = send(server, "PATCH", "pods/box", patch, "application/json-patch+json")
    assert (code, status["reason"]) == (422, "Invalid"), status
    assert api.read_namespaced_pod("box", NS).metadata.labels == {}


# -- exec -------------------------------------------------------------------------------------


def test_exec_echo(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    resp = run_exec(pod, ["echo", "hello"])
    resp.run_forever(timeout=5)
    assert resp.read_stdout() == "hello\n"
    assert resp.returncode == 0
    record = server.execs[-1]
    assert (record.namespace, record.pod, record.container) == (NS, pod, "main")
    assert record.argv == ["echo", "hello"]
    assert record.protocol == "v5.channel.k8s.io"
    assert record.pid and record.returncode == 0


def test_exec_stderr_and_exit_code(api: client.CoreV1Api, pod: str, run_exec: RunExec) -> None:
    resp = run_exec(pod, ["sh", "-c", "echo out; echo err >&2; exit 2"])
    resp.run_forever(timeout=5)
    assert resp.read_stdout() == "out\n"
    assert resp.read_stderr() == "err\n"
    status = json.loads(resp.peek_channel(3))
    assert status == {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: error executing command "
        "[sh -c echo out; echo err >&2; exit 2], exit code 2",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "2"}]},
    }
    assert resp.returncode == 2


def test_exec_stdin_then_close_v5(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    resp = run_exec(pod, ["cat"], stdin=True)
    resp.write_stdin("hello from stdin\n")
    assert resp.readline_stdout(timeout=5) == "hello from stdin"
    resp.close_channel(0)  # v5: half-close stdin, so cat sees EOF and exits
    resp.run_forever(timeout=5)
    assert resp.returncode == 0
    assert server.execs[-1].stdin_closed is True


def test_exec_large_stdin_round_trip(api: client.CoreV1Api, pod: str, run_exec: RunExec) -> None:
    data = os.urandom(5 * 1024 * 1024)
    resp = run_exec(pod, ["cat"], stdin=True, binary=True)
    resp.write_stdin(data)
    resp.close_channel(0)
    resp.run_forever(timeout=15)
    assert resp.read_stdout() == data
    assert resp.returncode == 0


def test_exec_frames_can_split_multibyte_characters(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    server.exec_frame_size = 1
    text = "é€"
    resp = run_exec(pod, ["printf", text], binary=True)
    resp.run_forever(timeout=5)
    assert resp.read_stdout() == text.encode()  # raw bytes, reassembled intact
    # The text-mode client decodes frame by frame, which shows the characters were split.
    resp = run_exec(pod, ["printf", text])
    resp.run_forever(timeout=5)
    assert resp.read_stdout() == "\ufffd" * len(text.encode())


def test_exec_handshake_delay(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    server.exec_handshake_delay = 0.4
    start = time.monotonic()
    resp = run_exec(pod, ["true"])
    assert time.monotonic() - start >= 0.4
    resp.run_forever(timeout=5)
    assert resp.returncode == 0


def test_exec_refused(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    server.exec_refused = True
    with pytest.raises(ApiException) as refused:
        run_exec(pod, ["true"])
    assert "403" in str(refused.value)
    assert server.execs == []


def test_exec_needs_an_existing_running_pod(
    server: KubeTestServer, api: client.CoreV1Api, run_exec: RunExec
) -> None:
    with pytest.raises(ApiException) as missing:
        run_exec("ghost", ["true"])
    assert "404" in str(missing.value)
    server.unschedulable = True
    api.create_namespaced_pod(NS, pod_body("pending"))
    with pytest.raises(ApiException) as pending:
        run_exec("pending", ["true"])
    assert "400" in str(pending.value)


def test_exec_query_booleans_are_parsed_like_go(server: KubeTestServer, pod: str) -> None:
    assert all(parse_go_bool(v) for v in ("1", "t", "T", "TRUE", "true", "True"))
    assert not any(parse_go_bool(v) for v in ("0", "f", "F", "FALSE", "false", "False"))
    url = f"{server.url}/api/v1/namespaces/{NS}/pods/{pod}/exec?command=true&stdin=maybe"
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(url)
    with error.value:
        assert error.value.code == 400
        assert "strconv.ParseBool" in json.loads(error.value.read())["message"]


def test_exec_maps_workspace_paths(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    workspace = server.workspace(NS, pod)
    assert workspace.is_dir()
    resp = run_exec(pod, ["mkdir", "-p", "/workspace/sessions/abc"])
    resp.run_forever(timeout=5)
    assert resp.returncode == 0
    assert (workspace / "sessions" / "abc").is_dir()
    resp = run_exec(pod, ["sh", "-c", 'pwd; echo "$HOME"'])
    resp.run_forever(timeout=5)
    assert resp.read_stdout() == f"{workspace}\n{workspace}\n"
    resp = run_exec(pod, ["env", "-C", "/workspace/sessions", "pwd"])
    resp.run_forever(timeout=5)
    assert resp.read_stdout() == f"{workspace / 'sessions'}\n"


def test_exec_missing_executable(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    resp = run_exec(pod, ["no-such-program"])
    resp.run_forever(timeout=5)
    status = json.loads(resp.read_channel(3))
    assert status["reason"] == "InternalError" and status["code"] == 500
    assert 'exec: "no-such-program": executable file not found in $PATH' in status["message"]
    assert server.execs[-1].returncode == 127


def test_an_exec_that_does_not_offer_v5_is_refused(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    with pytest.raises(ApiException) as refused:
        run_exec(pod, ["true"], _headers={"sec-websocket-protocol": "v4.channel.k8s.io"})
    assert "400" in str(refused.value)
    assert "requested protocol(s) are not supported" in str(refused.value)
    assert server.execs == []


def test_closing_the_websocket_kills_the_process(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    resp = run_exec(pod, ["sleep", "100"])
    record = wait_for(lambda: server.execs and server.execs[-1].pid and server.execs[-1])
    assert record.returncode is None
    resp.close()
    wait_for(lambda: record.returncode is not None)
    assert record.returncode == -9
    with pytest.raises(ProcessLookupError):
        os.kill(record.pid, 0)


def test_deleting_the_pod_kills_its_execs(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    resp = run_exec(pod, ["sleep", "100"])
    record = wait_for(lambda: server.execs and server.execs[-1].pid and server.execs[-1])
    api.delete_namespaced_pod(pod, NS)
    resp.run_forever(timeout=5)
    assert resp.returncode == 137  # SIGKILL, reported as a shell would
    assert record.returncode == -9


def test_background_leftovers_live_until_the_pod_is_deleted(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec
) -> None:
    resp = run_exec(pod, ["sh", "-c", "sleep 100 >/dev/null 2>&1 & echo $!"])
    resp.run_forever(timeout=5)
    assert resp.returncode == 0
    leftover = int(resp.read_stdout())
    time.sleep(0.1)
    assert alive(leftover)
    api.delete_namespaced_pod(pod, NS)
    wait_for(lambda: not alive(leftover))


def test_concurrent_execs(
    server: KubeTestServer, api: client.CoreV1Api, pod: str, run_exec: RunExec, tmp_path: Path
) -> None:
    api.create_namespaced_pod(NS, pod_body("other"))
    wait_for(lambda: is_ready(api.read_namespaced_pod("other", NS)))
    outputs: dict[int, str] = {}

    # Each exec waits (up to 30 s) until all four have started: run one after another, the
    # first would see only itself.
    met = tmp_path / "met"
    met.mkdir()
    count = f"$(ls {met} | wc -l)"
    wait = (
        f"touch {met}/$0; n=0;"
        f" while [ {count} -lt 4 ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done"
    )

    def one(index: int, pod_name: str) -> None:
        command = f"{wait}; echo {index} $HOSTNAME {count}"
        resp = run_exec(pod_name, ["sh", "-c", command, str(index)])
        resp.run_forever(timeout=60)
        outputs[index] = resp.read_stdout()

    threads = [
        threading.Thread(target=one, args=(i, name))
        for i, name in enumerate([pod, pod, "other", "other"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == {0: "0 box 4\n", 1: "1 box 4\n", 2: "2 other 4\n", 3: "3 other 4\n"}
    assert len({record.pid for record in server.execs}) == 4


def test_stop_kills_running_execs(tmp_path: Path) -> None:
    server = KubeTestServer(tmp_path).start()
    server.ready_delay = 0
    api_client = client.ApiClient(server.configuration())
    api = client.CoreV1Api(api_client)
    try:
        api.create_namespaced_pod(NS, pod_body("box"))
        resp = open_exec(api, "box", ["sleep", "100"])
        record = wait_for(lambda: server.execs and server.execs[-1].pid and server.execs[-1])
    finally:
        server.stop()
        api_client.close()
    assert record.returncode == -9
    close_exec(resp)
