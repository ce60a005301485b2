"""The exec transport of the kubernetes backend (`sandboxes/backends/kubernetes_exec.py`)."""

from __future__ import annotations

import pytest
from kubernetes import client as kubernetes

from sandboxes.backends.kubernetes_exec import exec_request


class RequestRecorder(kubernetes.ApiClient):
    """An ApiClient that keeps the request a generated method hands it, and sends nothing."""

    class Sent(Exception):
        pass

    request: tuple[str, str, dict]

    def call_api(
        self, method, url, header_params=None, body=None, post_params=None, _request_timeout=None
    ):
        self.request = (method, url, dict(header_params or {}))
        raise RequestRecorder.Sent


def test_the_exec_request_is_the_one_the_clients_generated_method_sends(kube):
    """Craft states the exec endpoint itself (`exec_request`, public `param_serialize`) rather
    than drive the generated method through the client's private `_websocket_request`.

    If this fails after an upgrade of the kubernetes client, the generated exec method now
    sends something else (a new parameter, another encoding, another authentication): read
    `CoreV1Api.connect_get_namespaced_pod_exec` and bring `exec_request` in line.
    """
    argv = ["sh", "-c", 'cd "$1" && exec "$@"', "sh", "/workspace/a b", "agent", "--x=é&y;z"]
    recorder = RequestRecorder(kube.configuration())
    try:
        kubernetes.CoreV1Api(recorder).connect_get_namespaced_pod_exec(
            "craft-sandbox-1",
            "craft-test",
            command=argv,
            container="sandbox",
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
    except RequestRecorder.Sent:
        pass
    else:
        pytest.fail("the generated exec method no longer sends through ApiClient.call_api")
    method, url, headers = recorder.request

    ours, our_headers = exec_request(
        kubernetes.ApiClient(kube.configuration()),
        namespace="craft-test",
        pod="craft-sandbox-1",
        container="sandbox",
        argv=argv,
    )
    assert method == "GET"
    assert url.startswith("http://")
    assert ours == "ws://" + url.removeprefix("http://")
    assert our_headers["authorization"] == headers["authorization"] == "Bearer kube-test-token"
