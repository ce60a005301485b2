"""Previews on the Kubernetes backend, against the test API server: the ports listening in
the pod (read by an exec) are offered, and the proxy reaches the app at the pod's address
(`status.podIP`; the test server's pods are processes of this machine, their address its
loopback), HTTP and websocket, through daphne.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time

import pytest
import websocket

from sandboxes.in_sandbox import demo_agent
from tests.ports import free_port
from tests.server import Daphne, api, ask, open_session

from .test_preview import Preview, ask_url, enter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def kube_preview(kube, tmp_path, settings):
    preview_port = free_port()
    origin = f"http://{{port}}-{{session}}.localhost:{preview_port}"
    settings.CRAFT_PREVIEW_ORIGIN = origin
    server = Daphne(
        tmp_path,
        options=("-e", f"tcp:port={preview_port}:interface=127.0.0.1"),
        CRAFT_SANDBOX_BACKEND="kubernetes",
        CRAFT_K8S_KUBECONFIG=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
        CRAFT_K8S_NAMESPACE="craft-preview",
        CRAFT_K8S_POLL_INTERVAL="0.05",
        CRAFT_K8S_READY_TIMEOUT="30",
        # The checkout's own file (`-m` would import the package the virtualenv points at).
        CRAFT_AGENT_COMMAND=f"{sys.executable} {demo_agent.__file__}",
        CRAFT_PREVIEW_ORIGIN=origin,
    ).start()
    yield Preview(server, preview_port)
    server.terminate()


def test_a_pods_app_is_offered_and_proxied_at_the_pods_address(kube_preview, kube, owner):
    server = kube_preview.server
    app_port = free_port()
    socket = open_session(server, owner, "default")
    pid = None
    try:
        deadline = time.monotonic() + 60
        while (said := ask(socket, f"serve {app_port}")).startswith("Your sandbox"):
            assert time.monotonic() < deadline, said  # the pod is still starting
            time.sleep(0.2)
        found = re.search(r"\(pid (\d+)\)", said)
        assert found, said
        pid = int(found[1])  # the test server's pods are processes of this machine
        session_id = socket.hello["session"]

        # The pod's listening ports, read by an exec, include the app's.
        status, listed = api(server, owner, "GET", f"/api/sessions/{session_id}/preview/")
        assert status == 200 and app_port in listed["ports"], listed
        assert any("/proc/net/tcp" in " ".join(e.argv) for e in kube.execs)

        from uuid import UUID

        session = UUID(session_id)
        status, given = ask_url(server, owner, session, port=app_port)
        assert status == 200, given
        cookie = enter(kube_preview, given["url"])
        host = kube_preview.host(session, app_port)
        status, _, page = kube_preview.request(host, "/", cookie=cookie)
        assert status == 200 and f"Demo app on port {app_port}".encode() in page
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{kube_preview.port}/ws",
            host=host,
            origin=f"http://{host}",
            cookie=cookie,
            timeout=30,
        )
        try:
            ws.send("from a pod")
            assert ws.recv() == "echo: from a pod"
        finally:
            ws.close()
    finally:
        socket.close()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_with_previews_on_sandbox_pods_admit_crafts_pods_only(kube_backend, settings):
    assert kube_backend.network_policy_manifest()["spec"]["ingress"] == []
    settings.CRAFT_PREVIEW_ORIGIN = "https://{port}-{session}.preview.example.com"
    settings.CRAFT_K8S_SERVER_NAMESPACE = "craft-web"
    [rule] = kube_backend.network_policy_manifest()["spec"]["ingress"]
    assert rule == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "craft-web"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "craft"}},
            }
        ]
    }
