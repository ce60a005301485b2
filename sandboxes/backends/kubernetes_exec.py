"""Pod exec as an agent process: Craft's own client of the exec websocket.

`ExecProcess` runs a program in a pod through `pods/exec` (stdin, stdout, stderr, no tty) and
offers it as an `AgentProcess`: the handshake within a deadline, then one reader thread per
exec that splits stdout into whole lines, logs stderr apart, parses the status channel for the
exit code, and pings an idle connection to find out when it died. It knows nothing of
sandboxes; the kubernetes backend (`kubernetes.py`) says which pod, container and argv.

Only this module and `kubernetes.py` import the kubernetes client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import certifi
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.stream import ws_client
from websocket import (
    ABNF,
    WebSocket,
    WebSocketBadStatusException,
    WebSocketException,
    WebSocketTimeoutException,
)

from ..agent.process import LineReader, LineTooLong, lines_on_a_thread
from ..stderr_log import StderrLog
from .base import SandboxError

logger = logging.getLogger(__name__)

# Channels: the first byte of every frame (v5 adds CLOSE, which half-closes a stream).
STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
V5_PROTOCOL = "v5.channel.k8s.io"


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: bytes
    stderr: str


class ExecProcess:
    """A program running in a pod through the exec websocket, as an `AgentProcess`.

    The kubernetes client builds the request (`exec_request`: URL, query, authentication);
    this class opens the websocket within a deadline, then reads it on one thread: stdout as
    bytes, decoded only as whole lines (a UTF-8 character split across frames survives),
    stderr to a `StderrLog` (lines cut, its logging rate-limited), the status channel parsed
    defensively for the exit code. Pings keep an idle connection honest: no frame at all for
    `idle_timeout` seconds means the connection is dead.
    """

    writes_block = True  # a websocket send waits for the connection

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str,
        pod: str,
        container: str,
        argv: list[str],
        handshake_timeout: float,
        idle_timeout: float,
        redact: Iterable[str] = (),
        tty: bool = False,
    ) -> None:
        self.ident = f"{pod}/exec-{id(self):x}"
        self._idle_timeout = idle_timeout
        self._lines: queue.SimpleQueue[bytes | LineTooLong] = queue.SimpleQueue()
        self._max_line = settings.CRAFT_MAX_MESSAGE_BYTES
        self._skipping = 0  # bytes of an over-long line dropped so far (0: not skipping)
        self._stdout = bytearray()
        self._stderr = StderrLog(self.ident, redact=redact)
        self._status: dict[str, Any] | None = None
        self._exit_code: int | None = None
        self._done = threading.Event()
        self._ws = self._handshake(
            api_client, namespace, pod, container, argv, handshake_timeout, tty
        )
        self.protocol = _subprotocol(self._ws)
        # recv() wakes up at least this often, to ping and to check for idleness.
        self._ws.settimeout(max(0.5, idle_timeout / 3))
        self._reader = threading.Thread(target=self._read, name=f"exec-{pod}", daemon=True)
        self._reader.start()

    @staticmethod
    def _handshake(
        api_client: k8s.ApiClient,
        namespace: str,
        pod: str,
        container: str,
        argv: list[str],
        timeout: float,
        tty: bool = False,
    ) -> WebSocket:
        """Open the exec websocket within `timeout` seconds, or close it and fail clearly.

        The client's `stream()` opens its websocket without any timeout (`_request_timeout`
        is ignored without preloading): a handshake that the API server never answers would
        hold a thread and a socket for good. So the client only builds the request
        (`exec_request`) and Craft opens the websocket itself, with a socket timeout, on a
        helper thread. When the deadline passes first, the socket is shut down, which ends
        the helper at once; a websocket that opens after that is closed.
        """
        opened: list[WebSocket] = []
        result: Future[WebSocket] = Future()
        handover = threading.Lock()
        abandoned = False

        def open_websocket() -> WebSocket:
            # Building the request may refresh a token (a kubeconfig exec plugin), so it
            # runs under the deadline too.
            configuration = api_client.configuration
            url, headers = exec_request(
                api_client, namespace=namespace, pod=pod, container=container, argv=argv, tty=tty
            )
            ws = WebSocket(sslopt=_ssl_options(configuration, url), skip_utf8_validation=False)
            opened.append(ws)
            options = _connect_options(configuration, url, headers)
            # A socket timeout a little past the deadline: the deadline below always comes
            # first, and the socket timeout only ends a connect that shutdown cannot reach.
            ws.connect(url, timeout=timeout + 1, **options)
            return ws

        def connect() -> None:
            nonlocal abandoned
            try:
                ws = open_websocket()
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
        self._send(STDIN, data)

    def _send(self, channel: int, data: bytes) -> None:
        if self._done.is_set():
            raise OSError("exec connection is closed")
        try:
            self._ws.send(bytes([channel]) + data, opcode=ABNF.OPCODE_BINARY)
        except (WebSocketException, OSError) as exc:
            raise OSError(f"exec connection failed: {exc}") from exc

    def readline(self, limit: int) -> bytes:
        # Lines were cut to CRAFT_MAX_MESSAGE_BYTES as they arrived (see _on_stdout).
        line = self._lines.get()
        if isinstance(line, LineTooLong):
            raise line
        return line

    def read_lines(self, reader: LineReader) -> None:
        # Its limit was applied as frames arrived (CRAFT_MAX_MESSAGE_BYTES, see _on_stdout).
        lines_on_a_thread(self.readline, reader, self.ident)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def exit_code(self) -> int | None:
        return self._exit_code

    def stderr_tail(self) -> str:
        return self._stderr.tail()

    def end_reason(self) -> str | None:
        # The pod's own limits act inside it; an exec does not hear why its process ended.
        return None

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


class ExecByteStream(ExecProcess):
    """A program in a pod whose stdout is bytes, not lines (the workspace tool's downloads),
    as a `sandboxes.workspace.ToolProcess`.

    Frames wait in a bounded queue: when the reader of the bytes is slower than the pod, the
    reader thread stops taking frames, and TCP holds the pod back; nothing piles up here.
    """

    QUEUED_FRAMES = 64

    def __init__(
        self, api_client: k8s.ApiClient, *, keep_stdin: bool = False, **options: Any
    ) -> None:
        """`keep_stdin`: leave stdin open for the caller to write (Craft's git tool reads
        its request there, a token among it) and close."""
        self._frames: queue.Queue[bytes] = queue.Queue(self.QUEUED_FRAMES)
        self._pending = b""
        self._stopped = threading.Event()
        super().__init__(api_client, **options)
        if not keep_stdin:
            self.close_stdin()

    def _on_stdout(self, payload: bytes) -> None:
        if payload:  # the empty priming frame is not the end
            self._put(payload)

    def _finish(self) -> None:
        super()._finish()
        self._put(b"")  # the end

    def _put(self, item: bytes) -> None:
        while not self._stopped.is_set():
            try:
                self._frames.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _next(self) -> bytes:
        if self._pending:
            chunk, self._pending = self._pending, b""
            return chunk
        if self._stopped.is_set():
            return b""
        chunk = self._frames.get()
        if not chunk:
            self._stopped.set()  # read to the end: nothing more will come
        return chunk

    def read(self, size: int) -> bytes:
        chunk = self._next()
        self._pending = chunk[size:]
        return chunk[:size]

    def readline(self, limit: int) -> bytes:
        line = b""
        while len(line) < limit and not line.endswith(b"\n"):
            chunk = self._next()
            if not chunk:
                break
            end = chunk.find(b"\n")
            cut = min(limit - len(line), len(chunk) if end < 0 else end + 1)
            line += chunk[:cut]
            self._pending = chunk[cut:]
        return line

    def finish(self, timeout: float) -> int | None:
        if not self._done.wait(timeout):
            self.stop()
            return None
        return self._exit_code

    def stop(self) -> None:
        self._stopped.set()
        self._close_socket()
        with contextlib.suppress(queue.Empty):
            while True:
                self._frames.get_nowait()  # frees a reader thread waiting to put
        with contextlib.suppress(queue.Full):
            self._frames.put_nowait(b"")  # and wakes one waiting to get: the end


class ExecTerminal(ExecProcess):
    """A shell in a pod on a terminal (exec with `tty=true`), as a `TerminalProcess`.

    Its stdout is the terminal's output, handed on as it comes (never cut into lines); a
    resize is a frame on the resize channel (`{"Width": cols, "Height": rows}`), which the
    kubelet applies to the terminal; the shell dies when the exec's websocket closes.
    """

    def __init__(self, api_client: k8s.ApiClient, *, cols: int, rows: int, **options: Any):
        self._listening = threading.Lock()
        self._early: list[bytes] = []  # output before `listen`
        self._output: Callable[[bytes], None] | None = None
        self._end: Callable[[], None] | None = None
        self._ended = False
        super().__init__(api_client, tty=True, **options)
        self.resize(cols, rows)

    def listen(self, output: Callable[[bytes], None], end: Callable[[], None]) -> None:
        with self._listening:  # the reader waits: what came first goes first
            for chunk in self._early:
                output(chunk)
            self._early.clear()
            self._output, self._end = output, end
            ended = self._ended
        if ended:
            end()

    def resize(self, cols: int, rows: int) -> None:
        size = json.dumps({"Width": cols, "Height": rows}).encode()
        with contextlib.suppress(OSError):
            self._send(RESIZE, size)

    def wait_exit(self, timeout: float) -> int | None:
        self._done.wait(timeout)
        return self._exit_code

    def terminate(self, timeout: float = 5.0) -> None:
        self._close_socket()
        self._done.wait(timeout)

    def _on_stdout(self, payload: bytes) -> None:
        if not payload:
            return  # the priming frame
        with self._listening:
            output = self._output
            if output is None:
                self._early.append(payload)
                return
        output(payload)

    def _finish(self) -> None:
        super()._finish()
        with self._listening:
            self._ended = True
            end = self._end
        if end is not None:
            end()


def exec_request(
    api_client: k8s.ApiClient,
    *,
    namespace: str,
    pod: str,
    container: str,
    argv: list[str],
    tty: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Return the websocket URL and the headers of an exec of `argv` in the pod's container
    (stdin, stdout, stderr, no tty; with `tty`, stdin and stdout on a terminal, which carries
    what would go to stderr), the request the client's generated
    `CoreV1Api.connect_get_namespaced_pod_exec` would send.

    Why not that method: it sends its request only through `ApiClient.call_api`, and the
    client's one way to turn that into a websocket is `stream()`, which opens the websocket
    with no timeout, by way of the private `kubernetes.stream.stream._websocket_request`,
    which swaps `call_api` on the ApiClient while it runs (kubernetes-client/python#928).
    The public `ApiClient.param_serialize`, which the generated methods themselves call, builds
    the same request (URL, query, the `BearerToken` authentication, token refresh included)
    from the endpoint's path and parameters, stated here; so Craft uses no private name and
    swaps nothing. Checked against kubernetes 37.0.2: `test_kubernetes_exec.py` compares this
    request with the generated method's, so an upgrade that changes either fails there.
    """
    _method, url, headers, _body, _post_params = api_client.param_serialize(
        method="GET",
        resource_path="/api/v1/namespaces/{namespace}/pods/{name}/exec",
        path_params={"namespace": namespace, "name": pod},
        query_params=[
            ("command", argv),
            ("container", container),
            ("stderr", not tty),
            ("stdin", True),
            ("stdout", True),
            ("tty", tty),
        ],
        header_params={},
        collection_formats={"command": "multi"},
        auth_settings=["BearerToken"],
    )
    return ws_client.get_websocket_url(url), headers


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
