"""Pod exec for the test API server: the `v5.channel.k8s.io` websocket, run as a process here.

An exec runs its argv as a process of this machine whose `/workspace` is the pod's folder
(`map_workspace`), wired to the channels of the protocol as a kubelet wires a container's
process: the empty priming frame, stdout and stderr in frames of bounded size, stdin, the
CLOSE signal that half-closes stdin, the exit status as a Status on channel 3, and the
process group killed when the client goes away. With `tty=true` the process runs on a
pseudo-terminal of its own (its controlling one), stdout carries it, and resize frames
(channel 4, `{"Width": C, "Height": R}`) set its size, as a kubelet does.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from .objects import bad_request, internal_error, parse_go_bool

V5_PROTOCOL = "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255

# The python client sends stdin as one websocket message, so messages of many megabytes
# must be accepted (aiohttp's default limit is 4 MiB).
MAX_EXEC_MESSAGE = 256 * 1024 * 1024


@dataclass
class ExecRecord:
    """One exec, as seen by the server.

    `returncode` is None while the command runs, then the subprocess's return code as Python
    reports it (negative for a signal, e.g. -9 when the server killed it). A command that could
    not be started gets 127 (not found) or 126 (not executable).
    """

    namespace: str
    pod: str
    container: str
    argv: list[str]
    protocol: str  # the negotiated subprotocol
    pid: int | None = None
    returncode: int | None = None
    stdin_closed: bool = False


@dataclass
class ExecOptions:
    command: list[str]
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool = False


def negotiate_subprotocol(header: str | None) -> str:
    """Return v5 when the client offers it, as an API server since Kubernetes 1.30 does.

    Craft and the python client both offer v5 (and v4); the older protocols, which cannot
    close stdin, are not modelled, so an exec that does not offer v5 is refused (400).
    """
    offered = [p.strip() for p in (header or "").split(",") if p.strip()]
    if V5_PROTOCOL not in offered:
        raise bad_request(
            f"requested protocol(s) are not supported: [{' '.join(offered)}]; "
            f"supports [{V5_PROTOCOL}]"
        )
    return V5_PROTOCOL


def parse_exec_options(query: Any, pod_name: str, containers: list[str]) -> ExecOptions:
    """Read PodExecOptions from the query string, validating like the API server."""

    def flag(name: str, default: bool) -> bool:
        values = query.getall(name, [])
        if not values:
            return default
        try:
            return parse_go_bool(values[-1])
        except ValueError as exc:
            raise bad_request(str(exc)) from None

    # The API server defaults stdout and stderr to true; stdin and tty to false.
    options = ExecOptions(
        command=list(query.getall("command", [])),
        container=query.get("container", ""),
        stdin=flag("stdin", False),
        stdout=flag("stdout", True),
        stderr=flag("stderr", True),
    )
    options.tty = flag("tty", False)
    if options.tty and options.stderr:
        raise bad_request("stderr cannot be true when tty is true")
    if not options.command:
        raise bad_request("you must specify at least one command for the container")
    if not (options.stdin or options.stdout or options.stderr):
        raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
    if not options.container and len(containers) == 1:
        options.container = containers[0]
    if options.container not in containers:
        raise bad_request(f"container {options.container} is not valid for pod {pod_name}")
    return options


def map_workspace(arg: str, workspace: Path, mounts: dict[str, Path] | None = None) -> str:
    """Rewrite `/workspace` and `/workspace/...` to the pod's local folder, and the mount
    paths of the container's other volumes to their local folders (the longest first)."""
    paths = {**(mounts or {}), "/workspace": workspace}
    for inside, local in sorted(paths.items(), key=lambda item: -len(item[0])):
        if arg == inside:
            return str(local)
        if arg.startswith(inside + "/"):
            return str(local) + arg[len(inside) :]
    return arg


def map_workspace_in_json(data: bytes, workspace: Path) -> bytes:
    """Rewrite JSON strings that start with `/workspace` to the pod's local folder.

    Agents learn their working directory over stdin (ACP `session/new` carries `cwd`). In a
    real pod `/workspace` exists; on this machine it does not, so the same mapping as for argv
    is applied to JSON string values in stdin. Each websocket message is rewritten on its
    own, which is enough for clients that send whole lines (the ACP client does).
    """
    local = json.dumps(str(workspace))[1:-1].encode()
    return data.replace(b'"/workspace/', b'"' + local + b"/").replace(
        b'"/workspace"', b'"' + local + b'"'
    )


def exit_status(argv: list[str], returncode: int) -> dict[str, Any]:
    """Return the Status the kubelet writes on channel 3 when the command ends."""
    if returncode == 0:
        return {"metadata": {}, "status": "Success"}
    # A process killed by a signal is reported like a shell would: 128 + signal.
    code = returncode if returncode > 0 else 128 - returncode
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(argv)}], exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def start_failure(argv0: str, exc: OSError) -> tuple[dict[str, Any], int]:
    """Return the Status the kubelet writes when the executable cannot be started (as
    containerd words it, without kind and apiVersion), and the exit code it stands for."""
    if isinstance(exc, PermissionError):
        detail, code = f'exec: "{argv0}": permission denied', 126
    elif "/" in argv0:
        detail, code = f'exec: "{argv0}": stat {argv0}: no such file or directory', 127
    else:
        detail, code = f'exec: "{argv0}": executable file not found in $PATH', 127
    cause = (
        "error executing command in container: failed to exec in container: OCI runtime exec "
        f"failed: exec failed: unable to start container process: {detail}: unknown"
    )
    status = internal_error(cause).status()
    del status["kind"], status["apiVersion"]
    return status, code


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL an exec's process group: the command and whatever it left running.

    The command leads its own session, so its pid is the group id. Once the command has been
    reaped that pid may be reused, so the group is then only signalled while no process holds
    the pid: in that case only our leftovers can still carry this group id.
    """
    if process.returncode is not None:
        try:
            os.kill(process.pid, 0)
        except ProcessLookupError:
            pass
        else:
            return  # the pid belongs to some other process now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class ExecSession:
    """One exec websocket: a process wired to the channels of the v5 protocol."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        record: ExecRecord,
        options: ExecOptions,
        workspace: Path,
        env: dict[str, str],
        *,
        mounts: dict[str, Path] | None = None,
        frame_size: Callable[[], int],
        on_spawn: Callable[[asyncio.subprocess.Process], None],
    ) -> None:
        self.ws = ws
        self.record = record
        self.options = options
        self.workspace = workspace
        self.env = env
        self.mounts = mounts or {}
        self.frame_size = frame_size  # read on every read of the output, so tests can change it
        self.on_spawn = on_spawn
        self.terminal = -1  # the pseudo-terminal's master side, with `tty`

    async def run(self) -> None:
        # The kubelet writes an empty message on the lowest writable channel as soon as the
        # connection is up; clients use it to know the stream is established.
        options = self.options
        await self._send(STDOUT if options.stdout else STDERR if options.stderr else ERROR, b"")
        try:
            process = await self._spawn()
        except OSError as exc:
            status, code = start_failure(options.command[0], exc)
            self.record.returncode = code
            await self._send_status(status)
            await self.ws.close()
            return
        self.record.pid = process.pid
        self.on_spawn(process)
        stdin_queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read_client(stdin_queue))
        helpers = [reader]
        if self.terminal >= 0:
            helpers.append(asyncio.create_task(self._feed_terminal(stdin_queue)))
            pumps = [asyncio.create_task(self._pump_terminal())]
        else:
            if process.stdin is not None:
                helpers.append(asyncio.create_task(self._feed_stdin(process, stdin_queue)))
            pumps = [
                asyncio.create_task(self._pump(stream, channel))
                for stream, channel in ((process.stdout, STDOUT), (process.stderr, STDERR))
                if stream is not None
            ]
        finished = asyncio.create_task(self._wait_finished(process, pumps))
        helpers += [*pumps, finished]
        try:
            done, _ = await asyncio.wait({reader, finished}, return_when=asyncio.FIRST_COMPLETED)
            if finished in done:
                await self._send_status(exit_status(options.command, process.returncode or 0))
                await self.ws.close()
            else:
                kill_group(process)  # the client went away: nobody will read the output
            # Bounded, in case something that escaped the process group holds the pipes open.
            await asyncio.wait({finished}, timeout=5)
        finally:
            if process.returncode is None:
                kill_group(process)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if process.returncode is None:
                await process.wait()
            if self.record.returncode is None:
                self.record.returncode = process.returncode
            if self.terminal >= 0:
                os.close(self.terminal)

    async def _spawn(self) -> asyncio.subprocess.Process:
        options = self.options
        if options.tty:
            return await self._spawn_on_terminal()
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        return await asyncio.create_subprocess_exec(
            *[map_workspace(arg, self.workspace, self.mounts) for arg in options.command],
            stdin=pipe if options.stdin else devnull,
            stdout=pipe if options.stdout else devnull,
            stderr=pipe if options.stderr else devnull,
            cwd=self.workspace,
            env=self.env,
            start_new_session=True,
        )

    async def _spawn_on_terminal(self) -> asyncio.subprocess.Process:
        """Start the command on a pseudo-terminal that becomes its controlling terminal."""
        master, slave = os.openpty()
        try:
            process = await asyncio.create_subprocess_exec(
                *[map_workspace(arg, self.workspace, self.mounts) for arg in self.options.command],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=self.workspace,
                env=self.env,
                start_new_session=True,
                preexec_fn=_take_terminal,
            )
        except OSError:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self.terminal = master
        return process

    async def _pump_terminal(self) -> None:
        """Send what the terminal shows until no process holds it (a read fails: EIO)."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                chunk = os.read(self.terminal, max(1, int(self.frame_size())))
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                loop.remove_reader(self.terminal)
            chunks.put_nowait(chunk)

        loop.add_reader(self.terminal, readable)
        try:
            connected = True
            while chunk := await chunks.get():
                if connected:
                    connected = await self._send(STDOUT, chunk)
        finally:
            loop.remove_reader(self.terminal)

    async def _feed_terminal(self, stdin_queue: asyncio.Queue[bytes | None]) -> None:
        while (chunk := await stdin_queue.get()) is not None:
            while chunk:
                try:
                    chunk = chunk[os.write(self.terminal, chunk) :]
                except BlockingIOError:
                    await asyncio.sleep(0.01)  # the terminal's input is full: the shell reads
                except OSError:
                    return

    async def _wait_finished(
        self, process: asyncio.subprocess.Process, pumps: list[asyncio.Task[None]]
    ) -> None:
        # The exec ends once the process has exited AND its output is drained, like the
        # kubelet, which waits for the output copies to finish.
        await asyncio.gather(*pumps)
        await process.wait()
        self.record.returncode = process.returncode

    async def _read_client(self, stdin_queue: asyncio.Queue[bytes | None]) -> None:
        """Read client frames until the websocket closes. Frames may be TEXT or BINARY."""
        async for message in self.ws:
            if message.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                break  # ERROR: the connection is broken
            data: bytes = message.data
            if isinstance(data, str):  # defensive: decode_text=False gives bytes
                data = data.encode()
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == RESIZE and self.terminal >= 0:
                _resize(self.terminal, payload)
            elif channel == STDIN and self.options.stdin:
                stdin_queue.put_nowait(payload)
            elif channel == CLOSE and payload == bytes([STDIN]) and not self.record.stdin_closed:
                self.record.stdin_closed = True
                stdin_queue.put_nowait(None)
            # Unknown channels, and resizes without a TTY, are ignored, as the kubelet does.

    async def _feed_stdin(
        self, process: asyncio.subprocess.Process, stdin_queue: asyncio.Queue[bytes | None]
    ) -> None:
        # A queue decouples reading the websocket from writing the pipe, so a client that
        # sends megabytes before reading its output cannot deadlock against the process.
        stdin = process.stdin
        assert stdin is not None
        try:
            while (chunk := await stdin_queue.get()) is not None:
                stdin.write(map_workspace_in_json(chunk, self.workspace))
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the process stopped reading; later input is dropped
        finally:
            with contextlib.suppress(Exception):
                stdin.close()

    async def _pump(self, stream: asyncio.StreamReader, channel: int) -> None:
        # read(n) returns whatever is available up to n bytes: output is not line-buffered
        # here, and a small frame size can split a multibyte character across frames.
        connected = True
        while chunk := await stream.read(max(1, int(self.frame_size()))):
            if connected:
                connected = await self._send(channel, chunk)

    async def _send(self, channel: int, payload: bytes) -> bool:
        try:
            await self.ws.send_bytes(bytes([channel]) + payload)
            return True
        except (ConnectionError, RuntimeError):
            return False

    async def _send_status(self, status: dict[str, Any]) -> None:
        await self._send(ERROR, json.dumps(status, separators=(",", ":")).encode())


def _take_terminal() -> None:
    """Make stdin, a terminal, the controlling terminal of the new session (in the child)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _resize(terminal: int, payload: bytes) -> None:
    """Apply a resize frame (`{"Width": C, "Height": R}`); a malformed one is ignored."""
    try:
        size = json.loads(payload)
        cols, rows = int(size["Width"]), int(size["Height"])
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    except (ValueError, TypeError, KeyError, OSError, struct.error):
        pass
