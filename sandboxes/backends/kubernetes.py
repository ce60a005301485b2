"""The kubernetes backend: a sandbox is a pod (plus a headless Service), agents run by exec.

Each sandbox is one pod named `craft-sandbox-<sandbox uuid>` with a workspace volume at
`/workspace`; a session's workspace is `/workspace/sessions/<session uuid>`. The agent of a
session runs through pod exec (stdin, stdout, stderr, no tty), one exec per cached agent
connection, reused across prompts exactly as a local subprocess would be.

Two kinds of API client, on purpose. `kubernetes.stream.stream()` swaps `call_api` on the
ApiClient behind the API object it is given while it runs (kubernetes-client/python issue
#928): a REST call made on that ApiClient from another thread in that window is sent as a
websocket handshake and fails with `ApiException(status=0, reason="Handshake status 200 OK")`,
and two overlapping streams can leave the patch installed for good. So the REST ApiClient is
never passed to `stream()` (nor to the same swap that `ExecProcess` uses to open its
websocket with a deadline), and every exec gets an ApiClient of its own.

Only this module imports the kubernetes client.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import certifi
from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.stream import ws_client
from kubernetes.stream.stream import _websocket_request
from urllib3.exceptions import HTTPError
from websocket import (
    ABNF,
    WebSocket,
    WebSocketBadStatusException,
    WebSocketException,
    WebSocketTimeoutException,
)

from ..acp import LineTooLong
from ..stderr_log import StderrLog
from .base import Health, Progress, Resource, SandboxError

if TYPE_CHECKING:
    from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

CONTAINER = "sandbox"
WORKSPACE = "/workspace"
POD_PREFIX = "craft-sandbox-"
# Waiting reasons after which a pod will not become ready without someone fixing something.
FATAL_WAITING_REASONS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
}
# Run the agent in its workspace without building a shell string from data: the script is a
# constant, the workspace and the agent's argv are its positional arguments.
# The session's workspace is made at its agent's first start (a new session touches nothing).
CD_AND_EXEC = 'mkdir -p "$1" && cd "$1" && shift && exec "$@"'

# One policy per sandbox namespace, for every sandbox pod in it.
NETWORK_POLICY = "craft-sandbox-isolation"
SANDBOX_LABEL = {"app.kubernetes.io/name": "craft-sandbox"}
# How Craft finds its pods and services again (the inventory): labels it sets on both.
MANAGED_SELECTOR = "app.kubernetes.io/name=craft-sandbox,app.kubernetes.io/managed-by=craft"
SANDBOX_ID_LABEL = "craft.dev/sandbox"

STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
V5_PROTOCOL = "v5.channel.k8s.io"


def load_configuration() -> k8s.Configuration:
    """Return client configuration: in-cluster when running in a pod, else a kubeconfig."""
    configuration = k8s.Configuration()
    kubeconfig = settings.CRAFT_K8S_KUBECONFIG or os.environ.get("KUBECONFIG")
    try:
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (k8s_config.ConfigException, OSError) as exc:
        raise SandboxError(f"cannot load Kubernetes configuration: {exc}") from exc
    return configuration


# --- exec ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: bytes
    stderr: str


class ExecProcess:
    """A program running in a pod through the exec websocket, as an `AgentProcess`.

    The kubernetes client does the handshake (auth, TLS, subprotocol); after that this class
    reads the websocket itself on one thread: stdout as bytes, decoded only as whole lines (a
    UTF-8 character split across frames survives), stderr to a `StderrLog` (lines cut, its
    logging rate-limited), the status channel parsed defensively for the exit code. Pings
    keep an idle connection honest: no frame at all for `idle_timeout` seconds means the
    connection is dead.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str,
        pod: str,
        argv: list[str],
        handshake_timeout: float,
        idle_timeout: float,
    ) -> None:
        self.ident = f"{pod}/exec-{id(self):x}"
        self._idle_timeout = idle_timeout
        self._lines: queue.SimpleQueue[bytes | LineTooLong] = queue.SimpleQueue()
        self._max_line = settings.CRAFT_MAX_MESSAGE_BYTES
        self._skipping = 0  # bytes of an over-long line dropped so far (0: not skipping)
        self._stdout = bytearray()
        self._stderr = StderrLog(self.ident)
        self._status: dict[str, Any] | None = None
        self._exit_code: int | None = None
        self._done = threading.Event()
        self._ws = self._handshake(api_client, namespace, pod, argv, handshake_timeout)
        self.protocol = _subprotocol(self._ws)
        # recv() wakes up at least this often, to ping and to check for idleness.
        self._ws.settimeout(max(0.5, idle_timeout / 3))
        self._reader = threading.Thread(target=self._read, name=f"exec-{pod}", daemon=True)
        self._reader.start()

    @staticmethod
    def _handshake(
        api_client: k8s.ApiClient, namespace: str, pod: str, argv: list[str], timeout: float
    ) -> WebSocket:
        """Open the exec websocket within `timeout` seconds, or close it and fail clearly.

        The client's `stream()` opens its websocket without any timeout (`_request_timeout`
        is ignored without preloading): a handshake that the API server never answers would
        hold a thread and a socket for good. So the client only builds the request (URL,
        query, auth headers, through the same `call_api` swap that `stream()` does, on this
        exec's own ApiClient) and Craft opens the websocket itself, with a socket timeout, on
        a helper thread. When the deadline passes first, the socket is shut down, which ends
        the helper at once; a websocket that opens after that is closed.
        """
        opened: list[WebSocket] = []
        result: Future[WebSocket] = Future()
        handover = threading.Lock()
        abandoned = False

        def open_websocket(
            configuration: k8s.Configuration,
            _method: str,
            url: str,
            headers: dict[str, Any] | None = None,
            **_ignored: Any,
        ) -> WebSocket:
            ws_url = ws_client.get_websocket_url(url)
            ws = WebSocket(sslopt=_ssl_options(configuration, ws_url), skip_utf8_validation=False)
            opened.append(ws)
            options = _connect_options(configuration, url, headers or {})
            # A socket timeout a little past the deadline: the deadline below always comes
            # first, and the socket timeout only ends a connect that shutdown cannot reach.
            ws.connect(ws_url, timeout=timeout + 1, **options)
            return ws

        def connect() -> None:
            nonlocal abandoned
            try:
                ws = _websocket_request(
                    open_websocket,
                    None,
                    k8s.CoreV1Api(api_client).connect_get_namespaced_pod_exec,
                    pod,
                    namespace,
                    container=CONTAINER,
                    command=argv,
                    stdin=True,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                )
            except BaseException as exc:
                result.set_exception(exc)
                return
            with handover:
                if abandoned:
                    _close_quietly(ws)
                else:
                    result.set_result(ws)

        helper = threading.Thread(target=connect, name=f"exec-handshake-{pod}", daemon=True)
        helper.start()
        try:
            return result.result(timeout=timeout)
        except FutureTimeout:
            with handover:
                abandoned = True
            if result.done() and result.exception() is None:
                return result.result()  # it made it after all
            for ws in opened:
                _shut_down(ws)
            helper.join(2.0)
            raise SandboxError(f"exec in pod {pod}: no handshake within {timeout:g} s") from None
        except (TimeoutError, WebSocketTimeoutException):
            raise SandboxError(f"exec in pod {pod}: no handshake within {timeout:g} s") from None
        except Exception as exc:
            raise SandboxError(exec_failure(pod, exc)) from exc

    # --- AgentProcess ---------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._done.is_set():
            raise OSError("exec connection is closed")
        try:
            self._ws.send(bytes([STDIN]) + data, opcode=ABNF.OPCODE_BINARY)
        except (WebSocketException, OSError) as exc:
            raise OSError(f"exec connection failed: {exc}") from exc

    def readline(self, limit: int) -> bytes:
        # Lines were cut to CRAFT_MAX_MESSAGE_BYTES as they arrived (see _on_stdout).
        line = self._lines.get()
        if isinstance(line, LineTooLong):
            raise line
        return line

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def exit_code(self) -> int | None:
        return self._exit_code

    def stderr_tail(self) -> str:
        return self._stderr.tail()

    def close_stdin(self) -> None:
        """Close the program's stdin (only the v5 protocol can; older ones ignore this)."""
        if self.protocol == V5_PROTOCOL and not self._done.is_set():
            try:
                self._ws.send(bytes([CLOSE, STDIN]), opcode=ABNF.OPCODE_BINARY)
            except (WebSocketException, OSError):
                pass

    def terminate(self, timeout: float = 5.0) -> None:
        """Close stdin and give the program a moment; then close the websocket (the kubelet
        kills the program when its exec stream goes away)."""
        self.close_stdin()
        self._done.wait(min(1.0, timeout))
        self._close_socket()
        self._done.wait(timeout)

    def wait(self, timeout: float) -> ExecResult:
        """Wait for the program to end and return what it wrote (for short commands)."""
        if not self._done.wait(timeout):
            self.terminate(1)
            raise SandboxError(f"exec did not finish within {timeout:g} s")
        chunks: list[bytes] = []
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if isinstance(line, bytes):
                chunks.append(line)
        return ExecResult(self._exit_code, b"".join(chunks), self.stderr_tail())

    # --- the reader thread ----------------------------------------------------------------

    def _read(self) -> None:
        last_frame = time.monotonic()
        try:
            while True:
                try:
                    opcode, frame = self._ws.recv_data_frame(True)
                except WebSocketTimeoutException:
                    if time.monotonic() - last_frame > self._idle_timeout:
                        self._stderr.note("exec connection idle: no frames, no pongs")
                        return
                    self._ws.ping()
                    continue
                last_frame = time.monotonic()
                if opcode == ABNF.OPCODE_CLOSE:
                    return
                if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and frame.data:
                    self._on_frame(bytes(frame.data))
        except (WebSocketException, OSError, ValueError):
            pass  # the connection went away or broke; what was read stays
        finally:
            self._finish()

    def _on_frame(self, data: bytes) -> None:
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            self._on_stdout(payload)
        elif channel == STDERR:
            self._stderr.feed(payload)
        elif channel == STATUS:
            self._on_status(payload)
        # Empty priming frames, resize and v5 close frames carry nothing for us.

    def _on_stdout(self, payload: bytes) -> None:
        """Split stdout into lines; skip a line longer than the limit without keeping it."""
        while payload:
            end = payload.find(b"\n")
            if self._skipping:
                if end < 0:
                    self._skipping += len(payload)
                    return
                self._lines.put(LineTooLong(self._skipping + end + 1))
                self._skipping = 0
            elif end < 0:
                self._stdout += payload
                if len(self._stdout) > self._max_line:
                    self._skipping = len(self._stdout)
                    self._stdout.clear()
                return
            else:
                self._stdout += payload[: end + 1]
                if len(self._stdout) > self._max_line + 1:
                    self._lines.put(LineTooLong(len(self._stdout)))
                else:
                    self._lines.put(bytes(self._stdout))
                self._stdout.clear()
            payload = payload[end + 1 :]

    def _on_status(self, payload: bytes) -> None:
        try:
            status = json.loads(payload)
        except ValueError:
            self._stderr.note(f"unreadable exec status: {payload[:200]!r}")
            self._exit_code = -1
            return
        self._status = status if isinstance(status, dict) else {}
        self._exit_code = exit_code_of(self._status)
        if self._exit_code != 0 and self._status.get("message"):
            self._stderr.note(str(self._status["message"]))

    def _finish(self) -> None:
        if self._stdout:
            self._lines.put(bytes(self._stdout))  # a last line without its newline
            self._stdout.clear()
        self._stderr.close()
        if self._exit_code is None and self._status is None:
            self._exit_code = -1  # ended without telling us how
        self._done.set()
        self._lines.put(b"")
        self._close_socket()

    def _close_socket(self) -> None:
        try:
            self._ws.close(timeout=1)
        except Exception:
            pass
        # When the server closed first, websocket-client's close() returns without closing
        # its socket: shut it down ourselves, or the file descriptor leaks.
        try:
            self._ws.shutdown()
        except Exception:
            pass


def exit_code_of(status: dict[str, Any]) -> int:
    """Return the exit code a status-channel message reports (-1 when it does not say)."""
    if status.get("status") == "Success":
        return 0
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(str(cause.get("message")))
            except ValueError:
                break
    return -1


def _ssl_options(configuration: k8s.Configuration, url: str) -> dict[str, Any]:
    """Return websocket TLS options as the client's own `create_websocket` builds them."""
    if not (url.startswith("wss://") and configuration.verify_ssl):
        options: dict[str, Any] = {"cert_reqs": ssl.CERT_NONE}
    else:
        options = {
            "cert_reqs": ssl.CERT_REQUIRED,
            "ca_certs": configuration.ssl_ca_cert or certifi.where(),
        }
        if configuration.assert_hostname is not None:
            options["check_hostname"] = configuration.assert_hostname
    if configuration.cert_file:
        options["certfile"] = configuration.cert_file
    if configuration.key_file:
        options["keyfile"] = configuration.key_file
    if configuration.tls_server_name:
        options["server_hostname"] = configuration.tls_server_name
    return options


def _connect_options(
    configuration: k8s.Configuration, url: str, headers: dict[str, Any]
) -> dict[str, Any]:
    """Return websocket connect options (auth header, subprotocols, proxy) like the client."""
    header = [f"sec-websocket-protocol: {V5_PROTOCOL},v4.channel.k8s.io"]
    if "authorization" in headers:
        header.append(f"authorization: {headers['authorization']}")
    options: dict[str, Any] = {"header": header}
    if configuration.proxy or configuration.proxy_headers:
        options = ws_client.websocket_proxycare(options, configuration, url, headers)
    return options


def _subprotocol(ws: WebSocket) -> str:
    """Return the subprotocol the API server chose (we sent the header ourselves, as the
    client does, so websocket-client did not record it)."""
    for name, value in (ws.getheaders() or {}).items():
        if name.lower() == "sec-websocket-protocol":
            return str(value)
    return ws.getsubprotocol() or ""


def _shut_down(ws: WebSocket) -> None:
    """Break a handshake in progress: shutdown() wakes a thread blocked on the socket."""
    raw = ws.sock
    if raw is None:
        return  # still connecting: the socket timeout ends that
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close_quietly(ws: WebSocket) -> None:
    try:
        ws.close(timeout=1)
    except Exception:
        pass
    try:
        ws.shutdown()
    except Exception:
        pass


def exec_failure(pod: str, exc: BaseException) -> str:
    """Return why an exec could not start, in words fit for a user (no headers, no reprs)."""
    if isinstance(exc, WebSocketBadStatusException):
        message = _status_message(exc.resp_body) or str(exc.status_message or "").strip()
        detail = f"{message} ({exc.status_code})" if message else f"HTTP {exc.status_code}"
        if exc.status_code == 404:
            return f"the sandbox's pod {pod} is gone: {detail}"
        if exc.status_code in (401, 403):
            return f"exec in pod {pod} refused: {detail}"
        return f"exec in pod {pod} failed: {detail}"
    if isinstance(exc, ApiException):
        return f"exec in pod {pod} failed: {_reason(exc)}"
    if isinstance(exc, OSError):
        why = exc.strerror or str(exc) or "connection failed"
        return f"cannot reach the Kubernetes API to exec in pod {pod}: {why}"
    if isinstance(exc, WebSocketException):
        return f"the exec connection to pod {pod} failed during its handshake"
    logger.warning("exec in pod %s failed", pod, exc_info=exc)
    return f"exec in pod {pod} failed unexpectedly (see the server log)"


def _status_message(body: bytes | None) -> str:
    """Return the `message` of a Kubernetes Status object in an HTTP body, or ""."""
    try:
        status = json.loads(body or b"")
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return str(message)[:500] if message else ""


# --- the backend --------------------------------------------------------------------------


def pod_name(sandbox: Sandbox) -> str:
    return f"{POD_PREFIX}{sandbox.id}"


def _is_status(exc: ApiException, *codes: int) -> bool:
    return exc.status in codes


class KubernetesBackend:
    """Sandboxes as pods; blocking calls, made from worker threads."""

    name = "kubernetes"
    start_slots = None  # agents start in their pods, on the cluster's CPUs

    def __init__(
        self,
        configuration: k8s.Configuration | None = None,
        *,
        rest_client: k8s.ApiClient | None = None,
        exec_api_client: Callable[[], k8s.ApiClient] | None = None,
    ) -> None:
        """Connect with `configuration` (default: in-cluster, else kubeconfig).

        `rest_client` and `exec_api_client` exist for tests; in particular, the test that
        shows why they must differ passes the same client for both.
        """
        self.configuration = configuration or load_configuration()
        # The REST client. Never pass it (or an API object built on it) to stream(): #928.
        self.rest_client = rest_client or k8s.ApiClient(self.configuration)
        self.core = k8s.CoreV1Api(self.rest_client)
        self.networking = k8s.NetworkingV1Api(self.rest_client)
        self._policy_namespaces: set[str] = set()  # where this process saw the policy exist
        # One fresh ApiClient per exec, so that no two streams ever share one either.
        self._exec_api_client = exec_api_client or (lambda: k8s.ApiClient(self.configuration))

    @property
    def namespace(self) -> str:
        return settings.CRAFT_K8S_NAMESPACE

    # --- lifecycle ------------------------------------------------------------------------

    def provision(self, sandbox: Sandbox, progress: Progress) -> str:
        name = pod_name(sandbox)
        # Before the pod: a sandbox must never run without its network policy.
        self._ensure_network_policy()
        progress("creating pod")
        self._create_or_adopt_pod(sandbox, progress)
        self._create_or_adopt_service(sandbox)
        self._wait_until_ready(name, progress)
        return name

    def _create_or_adopt_pod(self, sandbox: Sandbox, progress: Progress) -> None:
        """Create the sandbox's pod; adopt one that exists and may still become ready.

        A pod left by an earlier attempt that failed (a bad image, unschedulable) is
        replaced, so that a retry after the cause is fixed gets a new pod; one being deleted
        is waited for, within CRAFT_K8S_READY_TIMEOUT.
        """
        name = pod_name(sandbox)
        deadline = time.monotonic() + settings.CRAFT_K8S_READY_TIMEOUT
        while True:
            try:
                self.core.create_namespaced_pod(self.namespace, self.pod_manifest(sandbox))
                return
            except ApiException as exc:
                if not _is_status(exc, 409):
                    raise SandboxError(f"cannot create pod: {_reason(exc)}") from exc
            # 409: it exists already (a retry, or another worker).
            try:
                existing = self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as exc:
                if _is_status(exc, 404):
                    continue  # gone meanwhile: create it
                raise SandboxError(f"cannot read pod: {_reason(exc)}") from exc
            going = existing.metadata.deletion_timestamp is not None
            failure = pod_failure(existing)
            if not going and not failure:
                return  # adopt it
            if time.monotonic() >= deadline:
                raise SandboxError("the previous pod of this sandbox is still terminating")
            if not going:
                progress(f"replacing the pod that failed ({failure})")
                self._delete_pod(name)
            time.sleep(settings.CRAFT_K8S_POLL_INTERVAL)

    def _delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot delete the failed pod: {_reason(exc)}") from exc

    def check_isolation(self) -> None:
        # Someone may have deleted the policy: ask again (a 409 means it is there).
        self._policy_namespaces.discard(self.namespace)
        self._ensure_network_policy()

    def _ensure_network_policy(self) -> None:
        """Create the namespace's sandbox NetworkPolicy unless it exists (409: adopt it)."""
        namespace = self.namespace
        if namespace in self._policy_namespaces:
            return
        try:
            self.networking.create_namespaced_network_policy(
                namespace, self.network_policy_manifest()
            )
        except ApiException as exc:
            if not _is_status(exc, 409):
                raise SandboxError(f"cannot create the network policy: {_reason(exc)}") from exc
        self._policy_namespaces.add(namespace)

    def _create_or_adopt_service(self, sandbox: Sandbox) -> None:
        try:
            self.core.create_namespaced_service(self.namespace, self.service_manifest(sandbox))
        except ApiException as exc:
            if not _is_status(exc, 409):
                raise SandboxError(f"cannot create service: {_reason(exc)}") from exc

    def _wait_until_ready(self, name: str, progress: Progress) -> None:
        deadline = time.monotonic() + settings.CRAFT_K8S_READY_TIMEOUT
        last_line = ""
        phase = "Unknown"
        while time.monotonic() < deadline:
            try:
                pod = self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as exc:
                raise SandboxError(f"cannot read pod: {_reason(exc)}") from exc
            phase = pod.status.phase if pod.status else "Unknown"
            if pod_is_ready(pod):
                progress("ready")
                return
            failure = pod_failure(pod)
            if failure:
                raise SandboxError(failure)
            line = f"pod {phase}" + (f": {e}" if (e := self._latest_event(name)) else "")
            if line != last_line:
                progress(line)
                last_line = line
            time.sleep(settings.CRAFT_K8S_POLL_INTERVAL)
        raise SandboxError(
            f"pod not ready after {settings.CRAFT_K8S_READY_TIMEOUT:g} s (phase {phase})"
        )

    def _latest_event(self, name: str) -> str:
        try:
            events = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={name}"
            ).items
        except ApiException:
            return ""  # progress is a courtesy; never fail provisioning over it
        if not events:
            return ""

        def when(event: Any) -> float:
            stamp = event.last_timestamp or event.first_timestamp or event.event_time
            return stamp.timestamp() if stamp else 0.0

        latest = max(events, key=when)
        return f"{latest.reason}: {latest.message}" if latest.message else str(latest.reason)

    def terminate(self, sandbox: Sandbox) -> None:
        """Delete the pod and the service, each on its own; gone already counts as deleted."""
        name = pod_name(sandbox)
        errors = []
        for delete in (self.core.delete_namespaced_pod, self.core.delete_namespaced_service):
            try:
                delete(name, self.namespace, grace_period_seconds=5)
            except ApiException as exc:
                if not _is_status(exc, 404):
                    errors.append(f"{delete.__name__}: {_reason(exc)}")
        if errors:
            raise SandboxError("; ".join(errors))

    def health(self, sandbox: Sandbox) -> Health:
        try:
            pod = self.core.read_namespaced_pod(pod_name(sandbox), self.namespace)
        except ApiException as exc:
            if _is_status(exc, 404):
                return Health(False, "the sandbox's pod is gone", gone=True)
            return Health(False, f"pod unreadable: {_reason(exc)}")
        if pod.metadata.deletion_timestamp is not None:
            return Health(False, "the sandbox's pod is being deleted", gone=True)
        if pod_is_ready(pod):
            return Health(True, "pod ready")
        return Health(False, pod_failure(pod) or f"pod {pod.status.phase}")

    def inventory(self) -> list[Resource]:
        """Return Craft's sandbox pods and services in the namespace, found by their labels.

        Pods already being deleted are left out: they are on their way.
        """
        try:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=MANAGED_SELECTOR
            ).items
            services = self.core.list_namespaced_service(
                self.namespace, label_selector=MANAGED_SELECTOR
            ).items
        except ApiException as exc:
            raise SandboxError(f"cannot list sandbox pods and services: {_reason(exc)}") from exc
        except (HTTPError, OSError) as exc:
            raise SandboxError(f"cannot reach the Kubernetes API: {exc}") from exc
        found = []
        for kind, items in (("pod", pods), ("service", services)):
            for item in items:
                if kind == "pod" and item.metadata.deletion_timestamp is not None:
                    continue
                try:
                    sandbox_id = UUID((item.metadata.labels or {}).get(SANDBOX_ID_LABEL, ""))
                except ValueError:
                    continue
                found.append(Resource(sandbox_id, kind, item.metadata.name))
        return found

    def remove(self, resource: Resource) -> None:
        delete = {
            "pod": self.core.delete_namespaced_pod,
            "service": self.core.delete_namespaced_service,
        }[resource.kind]
        try:
            delete(resource.name, self.namespace, grace_period_seconds=5)
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot delete {resource}: {_reason(exc)}") from exc

    # --- workspaces and agents -----------------------------------------------------------

    def workspace_path(self, sandbox: Sandbox, session_id: UUID) -> str:
        # session_id is a UUID, so the path cannot leave /workspace/sessions.
        return f"{WORKSPACE}/sessions/{UUID(str(session_id))}"

    def remove_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        self._run(sandbox, ["rm", "-rf", "--", self.workspace_path(sandbox, session_id)])

    def start_agent(self, sandbox: Sandbox, session_id: UUID) -> ExecProcess:
        workspace = self.workspace_path(sandbox, session_id)
        argv = ["sh", "-c", CD_AND_EXEC, "sh", workspace, *settings.CRAFT_AGENT_COMMAND]
        return self.exec(sandbox, argv)

    def exec(self, sandbox: Sandbox, argv: list[str]) -> ExecProcess:
        """Start `argv` in the sandbox's pod on a websocket of its own."""
        return ExecProcess(
            self._exec_api_client(),
            namespace=self.namespace,
            pod=pod_name(sandbox),
            argv=argv,
            handshake_timeout=settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT,
            idle_timeout=settings.CRAFT_K8S_EXEC_IDLE_TIMEOUT,
        )

    def _run(self, sandbox: Sandbox, argv: list[str]) -> ExecResult:
        process = self.exec(sandbox, argv)
        process.close_stdin()
        result = process.wait(settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT + 30)
        if result.exit_code != 0:
            raise SandboxError(
                f"{argv[0]} failed in the sandbox (exit {result.exit_code}): {result.stderr}"
            )
        return result

    # --- manifests ------------------------------------------------------------------------

    def labels(self, sandbox: Sandbox) -> dict[str, str]:
        return {
            **SANDBOX_LABEL,
            "app.kubernetes.io/managed-by": "craft",
            "craft.dev/sandbox": str(sandbox.id),
            "craft.dev/owner": str(sandbox.owner_id),
        }

    def pod_manifest(self, sandbox: Sandbox) -> dict[str, Any]:
        """Return the pod: non-root, no capabilities, bounded resources, one workspace."""
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name(sandbox), "labels": self.labels(sandbox)},
            "spec": {
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "restartPolicy": "Always",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": settings.CRAFT_K8S_RUN_AS_USER,
                    "runAsGroup": settings.CRAFT_K8S_RUN_AS_USER,
                    "fsGroup": settings.CRAFT_K8S_RUN_AS_USER,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": CONTAINER,
                        "image": settings.CRAFT_K8S_IMAGE,
                        "imagePullPolicy": settings.CRAFT_K8S_IMAGE_PULL_POLICY,
                        "workingDir": WORKSPACE,
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "resources": {
                            "requests": {
                                "cpu": settings.CRAFT_K8S_CPU_REQUEST,
                                "memory": settings.CRAFT_K8S_MEMORY_REQUEST,
                            },
                            "limits": {
                                "cpu": settings.CRAFT_K8S_CPU_LIMIT,
                                "memory": settings.CRAFT_K8S_MEMORY_LIMIT,
                            },
                        },
                        "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE}],
                    }
                ],
                "volumes": [
                    {
                        "name": "workspace",
                        "emptyDir": {"sizeLimit": settings.CRAFT_K8S_WORKSPACE_SIZE},
                    }
                ],
            },
        }

    def network_policy_manifest(self) -> dict[str, Any]:
        """Return the NetworkPolicy of every sandbox pod in the namespace.

        No ingress at all (exec reaches a pod through the kubelet, not the pod network). Egress
        to the cluster's DNS, and to every address except CRAFT_K8S_EGRESS_BLOCKED: the private
        ranges where pods, services, nodes and the Kubernetes API live, and link-local cloud
        metadata. Agents may still reach the internet (their model providers).
        """
        blocked = [ipaddress.ip_network(cidr) for cidr in settings.CRAFT_K8S_EGRESS_BLOCKED]
        allowed = []
        for everything in (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")):
            excepted = [str(net) for net in blocked if net.version == everything.version]
            allowed.append({"ipBlock": {"cidr": str(everything), "except": excepted}})
        cluster_dns = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": NETWORK_POLICY,
                "labels": {"app.kubernetes.io/managed-by": "craft"},
            },
            "spec": {
                "podSelector": {"matchLabels": SANDBOX_LABEL},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": [
                    {
                        "to": [cluster_dns],
                        "ports": [
                            {"protocol": "UDP", "port": 53},
                            {"protocol": "TCP", "port": 53},
                        ],
                    },
                    {"to": allowed},
                ],
            },
        }

    def service_manifest(self, sandbox: Sandbox) -> dict[str, Any]:
        """Return a headless Service: a stable DNS name for the sandbox (e.g. for previews)."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": pod_name(sandbox), "labels": self.labels(sandbox)},
            "spec": {
                "clusterIP": "None",
                "selector": {"craft.dev/sandbox": str(sandbox.id)},
                "ports": [{"name": "preview", "port": 8080, "targetPort": 8080}],
            },
        }


def pod_is_ready(pod: Any) -> bool:
    status = pod.status
    if status is None or status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def pod_failure(pod: Any) -> str:
    """Return why the pod will not become ready without help, or "" if it still may."""
    status = pod.status
    if status is None:
        return ""
    if status.phase in ("Failed", "Succeeded"):
        return f"pod {status.phase.lower()}: {status.message or status.reason or 'no reason given'}"
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return f"pod cannot be scheduled: {condition.message}"
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in FATAL_WAITING_REASONS:
            return f"{waiting.reason}: {waiting.message or container.image}"
    return ""


def _reason(exc: ApiException) -> str:
    """Return the message of a Kubernetes Status error, or the HTTP reason."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return f"{body['message']} ({exc.status})"
    return f"{exc.reason} ({exc.status})"
