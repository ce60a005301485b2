"""What every benchmark needs: a throwaway site, a daphne server, signed-in websocket clients.

A `Site` is a private database (SQLite in a temporary folder by default; with
`BENCH_DATABASE_URL=postgres://user@host:port/name` a fresh PostgreSQL database created beside
`name` and dropped afterwards), a sandbox root, and the environment daphne runs with. The
benchmark process sets Django up against the same database to create users and sessions.
Clients are aiohttp websockets, whose frame parser is compiled: the client must not be what
limits a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes.backends.containment import module_command
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


# What every streaming figure asks of an agent: 40 chunks, 50 ms apart (20 updates/s).
SLOW = "slow 40 0.05"
SLOW_CHUNKS = 40
FOLLOW_UP = "count 1"


def raise_open_files_limit() -> int:
    """Let this process (and the daphne it starts) hold many sockets; return the new limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def percentile(values: list[float], p: float) -> float:
    """Return the p-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Figure:
    """One row of the benchmark table."""

    name: str
    value: float
    unit: str
    target: str
    held: bool | None  # None: informational, no target
    detail: str = ""


class Site:
    """A private database, sandbox root and server environment for one benchmark run."""

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="craft-bench-"))
        self.uid_base = 1_300_000_000 + secrets.randbelow(1000) * 10_000
        # As a checkout's var/ is: sandbox users (when running as root) can enter it.
        self.workdir.chmod(0o711)
        (self.workdir / "static").mkdir()  # STATIC_ROOT; WhiteNoise warns when it is missing
        self._pg_admin: str | None = None
        self._pg_name: str | None = None
        url = os.environ.get("BENCH_DATABASE_URL")
        if url:
            server, _, name = url.rpartition("/")
            self._pg_admin = f"{server}/{name or 'postgres'}"
            self._pg_name = f"craft_bench_{uuid.uuid4().hex[:10]}"
            self._psql(f"CREATE DATABASE {self._pg_name}")
            url = f"{server}/{self._pg_name}"
        else:
            url = f"sqlite:///{self.workdir / 'bench.sqlite3'}"
        self.database = url.split(":", 1)[0].replace("postgres", "postgresql")
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "craft.settings",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "bench-only-secret",
            "DJANGO_SECURE_COOKIES": "0",
            "DJANGO_SECURE_SSL_REDIRECT": "0",
            "DATABASE_URL": url,
            "CRAFT_VAR_DIR": str(self.workdir),
            "CRAFT_SANDBOX_ROOT": str(self.workdir / "sandboxes"),
            # A uid range of its own, so a network rule, sandbox networks and cgroups of its own
            # (removed by `close`): never those of an installation on this machine.
            "CRAFT_SANDBOX_UID_BASE": str(self.uid_base),
            "CRAFT_SANDBOX_UID_COUNT": "10000",
            "CRAFT_LOG_LEVEL": "WARNING",
            # One bench user drives up to 80 agents at once (50 sessions, then 20 cold starts
            # beside 10 streamers): a server capacity figure, not a per-user one.
            "CRAFT_MAX_AGENTS_PER_USER": "200",
            # Likewise its sockets: 10,000 idle ones on one session measure the server.
            "CRAFT_MAX_SOCKETS_PER_USER": "0",
            # The venv's scripts (craft-demo-agent, daphne) must be found by subprocesses.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **(extra_env or {}),
        }

    def _psql(self, sql: str) -> None:
        import psycopg

        assert self._pg_admin is not None
        with psycopg.connect(self._pg_admin, autocommit=True) as conn:
            conn.execute(sql)

    def setup_django(self) -> None:
        """Point this process's Django at the site's database and migrate it."""
        os.environ.update(self.env)
        # Set-up queries run in this process's event loop before anything is timed; the
        # server (another process) never sees this switch.
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        # Sandboxes are provisioned here, where no agent is wanted: only the server keeps
        # warm agents (CRAFT_WARM_AGENTS, its default unless a benchmark says otherwise).
        os.environ["CRAFT_WARM_AGENTS"] = "0"
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def close(self) -> None:
        from django.db import connections

        from sandboxes.backends import budget, firewall, network

        connections.close_all()
        if os.geteuid() == 0:
            network.remove_installation(self.uid_base)
            budget.remove(self.uid_base)
            firewall.remove(self.uid_base)
        if self._pg_name is not None:
            self._psql(f"DROP DATABASE IF EXISTS {self._pg_name} WITH (FORCE)")
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- data (sync Django; call before the server starts or from a thread) -------------

    def user(self, name: str) -> tuple[Any, str]:
        """Create a user; return it and a signed-in session cookie."""
        from django.contrib.auth import get_user_model

        from tests.craft.wsclient import session_cookie

        user = get_user_model().objects.create_user(name, password="bench-password-unused")
        return user, session_cookie(user)

    def session(self, user: Any, title: str = "bench") -> str:
        from craft.services import open_session
        from sandboxes.services import provision_sandbox

        provision_sandbox(user)  # here, not in the background: the figures are about turns
        return str(open_session(user, title).pk)

    def home_of(self, user: Any) -> Path:
        """Return the home folder of the user's (local) sandbox, where warm agents wait."""
        from sandboxes.models import Sandbox

        return Path(Sandbox.objects.live().owned_by(user).get().reference, "home").resolve()

    # --- the server ------------------------------------------------------------------

    @contextlib.contextmanager
    def serve(self, *daphne_args: str, **env: str) -> Iterator[Server]:
        """Serve the site with daphne (`env` on top of the site's environment)."""
        port = free_port()
        log = (self.workdir / f"daphne-{port}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", *daphne_args, "-b", "127.0.0.1", "-p", str(port),
             "craft.asgi:application"],
            env={**self.env, **env}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/accounts/login/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"daphne did not start; see {log.name}") from None
                time.sleep(0.05)
        try:
            yield Server(url, process)
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


@dataclass
class Server:
    url: str
    process: subprocess.Popen

    def rss_kib(self) -> int:
        """Return daphne's resident memory in KiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


class Client:
    """One signed-in websocket on one session, with the frames it received and when."""

    def __init__(self, http: Any, ws: Any, hello: dict[str, Any]) -> None:
        self.http = http
        self.ws = ws
        self.hello = hello

    @classmethod
    async def open(cls, server: Server, cookie: str, session_id: str) -> Client:
        import aiohttp

        # The server's own origin: the Origin check compares scheme, host and port.
        http = aiohttp.ClientSession(headers={"Cookie": cookie, "Origin": server.url})
        ws = await http.ws_connect(
            f"{server.url.replace('http', 'ws')}/ws/sessions/{session_id}/",
            max_msg_size=0,
            autoping=True,  # daphne pings every 20 s; aiohttp answers and hides them
        )
        hello = json.loads((await ws.receive()).data)
        assert hello["type"] == "hello", hello
        return cls(http, ws, hello)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(frame))

    async def frame(self, wait: float = 60) -> dict[str, Any]:
        message = await asyncio.wait_for(self.ws.receive(), wait)
        if message.data is None or not isinstance(message.data, str):
            raise RuntimeError(f"socket closed: {message}")
        return json.loads(message.data)

    async def prompt(self, text: str) -> float:
        """Send a prompt, wait for its turn_end; return the seconds it took.

        Events of other turns (another socket's, arriving here too) are skipped.
        """
        started = time.perf_counter()
        prompt_id = uuid.uuid4().hex
        await self.send({"type": "prompt", "id": prompt_id, "text": text})
        mine, error = False, None
        while True:
            frame = await self.frame()
            if frame["type"] == "error":
                raise RuntimeError(f"prompt refused: {frame}")
            if frame.get("kind") == "user_message":
                mine = frame["data"].get("id") == prompt_id
            elif mine and frame.get("kind") == "agent_error":
                error = frame["data"]
            elif mine and frame.get("kind") == "turn_end":
                if frame["data"].get("stop_reason") != "end_turn":
                    raise RuntimeError(f"turn ended badly: {frame}; the agent's error: {error}")
                return time.perf_counter() - started

    async def answer(self, text: str) -> str:
        """Send a prompt and return the text the agent answered in its turn."""
        prompt_id = uuid.uuid4().hex
        await self.send({"type": "prompt", "id": prompt_id, "text": text})
        mine, chunks = False, []
        while True:
            frame = await self.frame()
            if frame["type"] == "error":
                raise RuntimeError(f"prompt refused: {frame}")
            kind = frame.get("kind")
            if kind == "user_message":
                mine = frame["data"].get("id") == prompt_id
            elif mine and kind == "agent_message_chunk":
                chunks.append(frame["data"]["content"]["text"])
            elif mine and kind == "turn_end":
                return "".join(chunks)

    async def stream(self, text: str) -> tuple[float, int]:
        """Prompt and count the frames until `turn_end`; return (seconds, frames).

        Frames are not parsed (the server builds them, so the turn's end is recognisable by
        its text): a parsing client would be what limits the rate.
        """
        started = time.perf_counter()
        await self.send({"type": "prompt", "id": uuid.uuid4().hex, "text": text})
        frames = 0
        while True:
            message = await asyncio.wait_for(self.ws.receive(), 60)
            data = message.data
            if not isinstance(data, str):
                raise RuntimeError(f"socket closed: {message}")
            frames += 1
            if '"kind":"turn_end"' in data or '"type":"error"' in data:
                if '"stop_reason":"end_turn"' not in data:
                    raise RuntimeError(f"turn ended badly: {data[:300]}")
                return time.perf_counter() - started, frames

    async def close(self) -> None:
        await self.ws.close()
        await self.http.close()


def _is_chunk(message: dict[str, Any]) -> bool:
    update = (message.get("params") or {}).get("update") or {}
    return update.get("sessionUpdate") == "agent_message_chunk"


# The floors' agent: this checkout's demo agent (an installed craft-demo-agent may be another
# checkout's), started as Craft starts it (containment.module_command: compiled, imported).
DEMO_AGENT = module_command(
    sys.executable, ROOT / "sandboxes" / "in_sandbox", "demo_agent", "main()"
)


class DirectAgent:
    """The demo agent driven directly over its stdio: the floor every figure is held to."""

    def __init__(self, cwd: Path) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            DEMO_AGENT,
            cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._ids = iter(range(1 << 30))
        self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        created, _ = self.request("session/new", {"cwd": str(cwd), "mcpServers": []})
        self.session_id = created["sessionId"]

    def request(
        self, method: str, params: dict[str, Any], on_update: Any = None
    ) -> tuple[Any, int]:
        """Send a request, read until its response; return (result, updates seen).

        `on_update()` is called as each agent message chunk arrives."""
        request_id = next(self._ids)
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()
        updates = 0
        while True:
            message = json.loads(self.process.stdout.readline())
            if message.get("id") == request_id and "method" not in message:
                return message["result"], updates
            updates += 1
            if on_update is not None and _is_chunk(message):
                on_update()

    def prompt(self, text: str, on_update: Any = None) -> tuple[float, int]:
        started = time.perf_counter()
        _, updates = self.request(
            "session/prompt",
            {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]},
            on_update,
        )
        return time.perf_counter() - started, updates

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def open_warm(server: Server, cookie: str, sessions: list[str]) -> list[Client]:
    """Open a socket on each session and start its agent with a first prompt."""
    clients = await asyncio.gather(*(Client.open(server, cookie, s) for s in sessions))
    for client in clients:
        await client.send({"type": "resume", "after": 0})
    await asyncio.gather(*(c.prompt(FOLLOW_UP) for c in clients))
    return list(clients)


CHUNK_MARK = '"kind":"agent_message_chunk"'


async def follow(
    client: Client, text: str, sent_at: float | None = None, stored: list[float] | None = None
) -> tuple[list[float], list[str]]:
    """Prompt and collect the arrival times of the turn's agent chunks; return (times, errors).
    The seconds from sending the prompt until it came back stored are appended to `stored`.

    Chunk frames are recognised by their text, not parsed: with hundreds of sockets in one
    client, parsing every frame would make the client part of what is measured.
    """
    sent = sent_at or time.perf_counter()
    await client.send({"type": "prompt", "id": uuid.uuid4().hex, "text": text})
    arrivals: list[float] = [sent]
    errors: list[str] = []
    try:
        while True:
            message = await asyncio.wait_for(client.ws.receive(), 60)
            data = message.data
            if not isinstance(data, str):
                raise RuntimeError(f"socket closed: {message}")
            if CHUNK_MARK in data:
                arrivals.append(time.perf_counter())
                continue
            frame = json.loads(data)
            if frame["type"] == "error":
                errors.append(frame["code"])
                break
            kind = frame.get("kind")
            if kind == "user_message" and stored is not None:
                stored.append(time.perf_counter() - sent)
            if kind == "turn_end":
                if frame["data"].get("stop_reason") != "end_turn":
                    errors.append(str(frame["data"]))
                break
            if kind == "agent_error":
                errors.append(frame["data"].get("message", "agent_error"))
    except Exception as exc:  # a closed socket or a timeout counts as an error
        errors.append(repr(exc))
    return arrivals, errors


def gaps_of(arrivals: list[float], start: float = 0.0, end: float = float("inf")) -> list[float]:
    """Return the gaps between consecutive chunks (not the prompt) that end inside a window."""
    chunks = arrivals[1:]
    return [b - a for a, b in itertools.pairwise(chunks) if start <= b < end]


def stream_summary(
    results: list[tuple[list[float], list[str]]], chunks: int, every: float = 0.05
) -> dict[str, Any]:
    """Summarise streams that each should have had `chunks` chunks, `every` seconds apart:
    the p99 of the gaps between a stream's chunks, of prompt -> first chunk, of each chunk's
    lateness (its arrival after the prompt minus the agent's own schedule: chunks that pile
    up and arrive together have short gaps, but are late), and the streams that went wrong."""
    gaps = [g for arrivals, _ in results for g in gaps_of(arrivals)]
    firsts = [a[1] - a[0] for a, _ in results if len(a) > 1]
    late = [t - a[0] - k * every for a, _ in results for k, t in enumerate(a[1:], 1)]
    errors = sum(len(errs) for _, errs in results)
    return {
        "gap_p99": percentile(gaps, 99),
        "first_p99": percentile(firsts, 99),
        "late_p99": percentile(late, 99),
        "errors": errors + sum(1 for a, _ in results if len(a) != chunks + 1),
    }


def working_in(folders: Any) -> dict[Path, set[int]]:
    """Return, for each of `folders`, the pids of live processes working in it (a sandbox's
    warm agents wait in its home); one pass over /proc. Craft's workspace tool, which runs
    in a session's workspace too (and may still be ending after its answer), is not counted."""
    wanted = {Path(f): set[int]() for f in folders}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                cwd = (entry / "cwd").resolve()
                if (
                    cwd in wanted
                    and (entry / "stat").read_text().split(") ", 1)[1][0] != "Z"
                    and b"workspace_tool" not in (entry / "cmdline").read_bytes()
                ):
                    wanted[cwd].add(int(entry.name))
    return wanted


def waiting_in(folder: Path) -> set[int]:
    """Return the pids of processes working in `folder`."""
    return working_in([folder])[folder]


class AsyncDirectAgent:
    """The demo agent as DirectAgent runs it, driven by a plain asyncio client: the floor
    of figures that drive hundreds of agents at once from one event loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._ids = itertools.count()
        self.session_id = ""

    @classmethod
    async def start(cls, cwd: Path) -> AsyncDirectAgent:
        """Spawn the agent in `cwd`, initialize it and open its session."""
        await asyncio.to_thread(cwd.mkdir, parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            *DEMO_AGENT, cwd=cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            limit=64 << 20,
        )  # fmt: skip
        agent = cls(process)
        await agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        created = await agent.request("session/new", {"cwd": str(cwd), "mcpServers": []})
        agent.session_id = created["sessionId"]
        return agent

    async def request(
        self, method: str, params: dict[str, Any], arrivals: list[float] | None = None
    ) -> Any:
        """Send a request and read until its response; return its result. The arrival time
        of each agent message chunk meanwhile is appended to `arrivals`."""
        assert self.process.stdin is not None and self.process.stdout is not None
        request_id = next(self._ids)
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()
        while True:
            raw = await self.process.stdout.readline()
            if not raw:
                raise RuntimeError(f"the agent closed its output during {method}")
            if arrivals is not None and b'"agent_message_chunk"' in raw:
                arrivals.append(time.perf_counter())
                continue
            message = json.loads(raw)
            if message.get("id") == request_id and "method" not in message:
                return message["result"]

    async def follow(self, text: str) -> tuple[list[float], list[str]]:
        """Prompt; return the send time and each chunk's arrival time (as `follow` does)."""
        arrivals = [time.perf_counter()]
        params = {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
        try:
            result = await self.request("session/prompt", params, arrivals)
        except Exception as exc:
            return arrivals, [repr(exc)]
        stop = result.get("stopReason")
        return arrivals, ([] if stop == "end_turn" else [f"stopped: {stop}"])

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            # Hundreds of agents ending at once share the machine: give them time.
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


def run_alone(
    description: str,
    run: Callable[..., Awaitable[list[Figure]]],
    argv: Any = None,
    **defaults: int,
) -> None:
    """Run one benchmark on its own (`python -m bench.<name>`): its options, named like the
    parameters of its `run`, from the command line; its table printed."""
    from .__main__ import print_table

    parser = argparse.ArgumentParser(description=description)
    for name, default in defaults.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    options = vars(parser.parse_args(argv))
    site = Site()
    try:
        site.setup_django()
        print_table(site.database, asyncio.run(run(site, **options)))
    finally:
        site.close()
