"""The exec transport of the kubernetes backend (`sandboxes/backends/kubernetes_exec.py`).

Execs run against the test API server, which runs the exec'd program as a process of this
machine and can split its output into frames as small as one byte, hold or refuse the
handshake.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid

import pytest
from kubernetes import client as kubernetes

from sandboxes import services
from sandboxes.agent.protocol import Update
from sandboxes.backends import SandboxError
from sandboxes.backends.kubernetes import pod_name
from sandboxes.backends.kubernetes_exec import exec_request
from sandboxes.models import Sandbox

from ..agents import reply_text, run_turn
from ..kube import NAMESPACE

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox(kube_backend, owner):
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    return sandbox


def new_session(sandbox) -> uuid.UUID:
    return uuid.uuid4()


# --- the request ----------------------------------------------------------------------------


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


# --- the websocket ----------------------------------------------------------------------------


def run(backend, sandbox, code: str, stdin: bytes | None = None):
    process = backend.exec(sandbox, [sys.executable, "-c", code])
    if stdin is not None:
        process.write(stdin)
    process.close_stdin()
    return process, process.wait(15)


def test_multibyte_characters_split_across_frames_survive(kube_backend, sandbox, kube):
    kube.exec_frame_size = 1  # every byte its own frame
    _, result = run(kube_backend, sandbox, "print('héllo ✓ wörld')")
    assert result.stdout.decode("utf-8") == "héllo ✓ wörld\n"
    assert result.exit_code == 0


def test_a_5_mb_agent_line_arrives_whole_over_exec(sandbox, kube):
    connection = services.connect_agent(sandbox, new_session(sandbox))
    items = run_turn(connection, "big 5", timeout=60)
    (chunk,) = [i for i in items if isinstance(i, Update) and i.kind == "agent_message_chunk"]
    assert len(chunk.data["content"]["text"].encode("utf-8")) >= 5 * 1024 * 1024


def test_stderr_is_kept_apart_and_a_non_zero_exit_is_surfaced(kube_backend, sandbox, kube):
    code = "import sys; print('out'); print('oops', file=sys.stderr); sys.exit(3)"
    _, result = run(kube_backend, sandbox, code)
    assert result.stdout == b"out\n"
    assert "oops" in result.stderr
    assert result.exit_code == 3
    with pytest.raises(SandboxError, match=r"exit 3"):
        kube_backend._run(sandbox, [sys.executable, "-c", code])


def test_exec_stderr_is_cut_per_line_and_logged_at_the_rate(
    kube_backend, sandbox, kube, settings, caplog
):
    settings.CRAFT_STDERR_LOG_BYTES_PER_SECOND = 4096
    caplog.set_level(logging.INFO, logger="craft.agent.stderr")
    code = (
        "import sys\n"
        "write = sys.stderr.buffer.write\n"
        "write(b'x' * 2**20 + b'\\n')\n"
        "for i in range(5000):\n"
        "    write(b'%05d' % i + b'y' * 94 + b'\\n')\n"
        "write(b'last')\n"
    )
    process, result = run(kube_backend, sandbox, code)
    assert result.exit_code == 0
    assert result.stderr.splitlines()[-2:] == ["04999" + "y" * 94, "last"]
    logged = [r.getMessage() for r in caplog.records if r.name == "craft.agent.stderr"]
    limit = settings.CRAFT_MAX_STDERR_BYTES
    assert logged[0] == f"[{process.ident}] {'x' * limit} [cut: a line of {2**20} bytes]"
    prefix = f"[{process.ident}] "
    lines = [m for m in logged if m.startswith(prefix) and "were not logged" not in m]
    dropped = sum(int(m.removeprefix(prefix).split()[0]) for m in logged if "were not logged" in m)
    assert len(lines) + dropped == 5002
    assert dropped > 2500, "500 kB went by at 4 kB a second"


def test_closing_stdin_ends_the_program_reading_it(kube_backend, sandbox, kube):
    code = "import sys; data = sys.stdin.read(); print(len(data), data.upper(), end='')"
    _, result = run(kube_backend, sandbox, code, stdin=b"hello")
    assert result.stdout == b"5 HELLO"
    assert result.exit_code == 0
    assert kube.execs[-1].stdin_closed
    assert kube.execs[-1].protocol == "v5.channel.k8s.io"


def test_a_slow_exec_handshake_is_bounded(kube_backend, sandbox, kube, settings):
    settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT = 1
    kube.exec_handshake_delay = 3
    # Given up before the server's handshake came: an unbounded wait would get it, and
    # `true` would run.
    with pytest.raises(SandboxError, match="no handshake within 1 s"):
        kube_backend.exec(sandbox, ["true"])


def client_sockets_to(port: int) -> int:
    """Return how many open sockets of this process are connected to `port` (client side)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += link.startswith("socket:[") and link[8:-1] in inodes
    return count


def handshake_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("exec-handshake-")]


def test_a_handshake_that_times_out_is_closed_leaving_no_thread_or_socket(
    kube_backend, sandbox, kube, settings
):
    settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT = 1
    kube.exec_handshake_delay = 6  # the API server takes the request and says nothing
    before = client_sockets_to(kube.port)  # the REST client's pooled connection
    assert handshake_threads() == []
    with pytest.raises(SandboxError, match="no handshake within 1 s"):
        kube_backend.exec(sandbox, ["true"])
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline and (
        handshake_threads() or client_sockets_to(kube.port) > before
    ):
        time.sleep(0.02)
    assert handshake_threads() == [], "the handshake's thread outlived its deadline"
    assert client_sockets_to(kube.port) == before, "the handshake's socket outlived it"


def test_an_exec_in_a_vanished_pod_fails_in_words_not_http_headers(kube_backend, sandbox, kube):
    kube_backend.core.delete_namespaced_pod(pod_name(sandbox), NAMESPACE)
    with pytest.raises(SandboxError) as failure:
        kube_backend.exec(sandbox, ["true"])
    message = str(failure.value)
    assert message == (
        f"the sandbox's pod {pod_name(sandbox)} is gone: "
        f'pods "{pod_name(sandbox)}" not found (404)'
    )


def test_a_refused_exec_fails_the_turn_clearly(sandbox, kube):
    session_id = new_session(sandbox)
    kube.exec_refused = True
    with pytest.raises(SandboxError, match="refused") as failure:
        services.connect_agent(sandbox, session_id)
    assert "-+-+-" not in str(failure.value) and "content-type" not in str(failure.value)
    kube.exec_refused = False
    assert services.connect_agent(sandbox, session_id).is_running


def test_an_idle_exec_connection_stays_up_across_prompts(kube_backend, sandbox, kube, settings):
    settings.CRAFT_K8S_EXEC_IDLE_TIMEOUT = 1  # pings every ~0.5 s keep it alive
    connection = services.connect_agent(sandbox, new_session(sandbox))
    time.sleep(2.5)
    assert connection.is_running
    assert reply_text(run_turn(connection, "later")) == "Echo: later"
