"""Hundreds of sessions per worker: N sessions streaming at once on one daphne, and the floor.

In one run, one after the other (N = 400 by default):

* floor: N demo agents, as DirectAgent runs them (no jail), driven by a plain asyncio client
  in this process: each started, initialized, given `session/new` and a first `count 1`
  (untimed), then all prompted `slow 40 0.05` (40 chunks, 50 ms apart) at once; the p99 of
  the gaps between an agent's consecutive chunks and of prompt -> first chunk.
* opening: N sessions of N / 10 users (10 each, their sandboxes provisioned beforehand,
  untimed), each created through the API (`POST /api/sessions/`), its websocket connected and
  resumed, and a first prompt (`count 1`) sent, all at once; the time until every first prompt
  is stored (its `user_message` came back). Beside it, the time until every one is answered
  (`turn_end`): that includes starting N agents, at most CRAFT_LOCAL_AGENT_STARTS at once.
* streaming: the same N sessions then prompt `slow 40 0.05` at once; the same p99s as the
  floor's, and what Craft adds to them. Beside them, the p99 of each chunk's lateness (its
  arrival after the prompt minus the agent's 50 ms per chunk): chunks that pile up and
  arrive together have short gaps, so the gap figure holds only if they were also in time.
* one user, ten at a time (on its own daphne, before the rest): N sessions of one more user,
  AT_ONCE at a time, each created, its socket connected and resumed, its first prompt sent
  and answered, its socket closed; the time until every one is answered. Its floor: N cold
  agents of that user's sandbox started by the backend in this process (jail, network,
  budget and start slots as in the server), AT_ONCE at a time, each prompted and answered.
* one at a time, first (on its own daphne, stopped before the rest): ONE_AT_A_TIME sessions
  of one more user opened one after another, after a few untimed; daphne's CPU per session
  opened (its create, socket, resume, first prompt and turn, its agent's start and first
  checkpoint), the figure to watch for what Craft spends per session: opened all at once,
  the opening moves with the machine as much as with Craft.
* where the CPU went while they streamed: daphne, the agents (daphne's descendants, or the
  floor's agents) and this client, in cores (CPU seconds per second of streaming).
* on PostgreSQL, then the same for M sessions (600 by default) over W workers (3), meeting
  through Redis (BENCH_REDIS_URL, as `bench.failover`): each session's socket, and so its
  agent, on the workers in turn; its gap p99 against its own floor of M agents.

The server runs with the defaults of a deployment except CRAFT_MAX_AGENT_CONNECTIONS (N and
the warm agents, with room to spare: the default, 200, is one server's agent count) and the
site's CRAFT_MAX_AGENTS_PER_USER and CRAFT_MAX_SOCKETS_PER_USER, and daphne pings rarely
(the client reads no socket while it waits for warm agents); warm agents are on
(CRAFT_WARM_AGENTS=1, one per sandbox). The sandboxes were made running by the bench, not by
the server, so none has a warm agent yet when the sessions open: every first prompt starts
its agent. Each sandbox gets one once its sessions' agents have started; the bench waits,
untimed, until each has it before streaming, so that no refill lands in a figure.

    .venv/bin/python -m bench.scale [--sessions 400] [--cluster_sessions 600] [--workers 3]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .failover import CLUSTER
from .harness import (
    FOLLOW_UP,
    SLOW,
    SLOW_CHUNKS,
    AsyncDirectAgent,
    Client,
    Figure,
    Server,
    Site,
    follow,
    percentile,
    raise_open_files_limit,
    run_alone,
    stream_summary,
    working_in,
)

SESSIONS = 400
# On PostgreSQL, also: this many sessions spread over this many workers (Redis between them).
CLUSTER_SESSIONS = 600
WORKERS = 3
PER_USER = 10
GAP_TARGET = 0.150
FIRST_TARGET = 0.300
ADDED_TARGET = 0.050
OPENING_TARGET = 5.0
DIRECT_STARTS = 8  # floor agents started at once (untimed)
WARM_WAIT = 120.0  # seconds to wait, untimed, for every sandbox's warm agent
ONE_AT_A_TIME = 40  # sessions opened one after another (after WARM_UP untimed)
AT_ONCE = 10  # one user's sessions opened this many at a time
TENS_TARGET = 10.0
WARM_UP = 5
TICK = os.sysconf("SC_CLK_TCK")


def note(text: str) -> None:
    print(f"  scale: {text}", file=sys.stderr, flush=True)


def cpu_seconds(pids: set[int]) -> float:
    """Return the CPU time (user and system) the live processes `pids` have used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def descendants(root: int) -> set[int]:
    """Return the pids of `root`'s live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def machine_busy() -> float:
    """Return the CPU time the whole machine has spent busy so far (`/proc/stat`)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / TICK


class CpuSplit:
    """CPU used by servers, their agents, this client and everything else on the machine
    ("rest": processes that came and went, such as agents started meanwhile, their jails and
    workspace tools, and whatever else runs here) between `start()` and `stop()`."""

    def __init__(self, server_pids: set[int], agent_pids: set[int]) -> None:
        self.server = server_pids
        self.agents = agent_pids
        self.me = {os.getpid()}

    def _now(self) -> tuple[float, float, float, float, float]:
        return (
            time.perf_counter(),
            cpu_seconds(self.server),
            cpu_seconds(self.agents),
            cpu_seconds(self.me),
            machine_busy(),
        )

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        end = self._now()
        wall = end[0] - self._start[0]
        names = ("server", "agents", "client", "machine")
        used = {n: (e - s) / wall for n, e, s in zip(names, end[1:], self._start[1:], strict=True)}
        machine = used.pop("machine")
        return {**used, "rest": max(0.0, machine - sum(used.values()))}


def cores(split: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in split.items())


def opening_cores(split: dict[str, float]) -> str:
    """The opening's CPU: no agent runs when it begins, so those it starts are in "rest"."""
    return cores({"daphne": split["server"], "client": split["client"], "rest": split["rest"]})


async def direct_floor(workdir: Path, count: int) -> dict[str, Any]:
    """The streams without Craft: `count` agents driven directly from this event loop."""
    starting = asyncio.Semaphore(DIRECT_STARTS)

    async def start(i: int) -> AsyncDirectAgent:
        async with starting:
            agent = await AsyncDirectAgent.start(workdir / f"scale-direct-{i}")
            await agent.follow(FOLLOW_UP)
            return agent

    agents = await asyncio.gather(*(start(i) for i in range(count)))
    try:
        split = CpuSplit(set(), {a.process.pid for a in agents})
        split.start()
        results = await asyncio.gather(*(a.follow(SLOW) for a in agents))
        used = split.stop()
    finally:
        await asyncio.gather(*(a.close() for a in agents))
    return {**stream_summary(results, SLOW_CHUNKS), "cpu": used}


async def create_session(server: Server, cookie: str) -> str:
    """Create a session through the API, as the page's "New session" does; return its id."""
    import aiohttp

    csrf = secrets.token_hex(16)  # any 32 characters: the cookie and the header must agree
    headers = {"Cookie": f"{cookie}; csrftoken={csrf}", "X-CSRFToken": csrf, "Origin": server.url}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(f"{server.url}/api/sessions/", json={"title": "scale"}) as answer,
    ):
        body = await answer.json()
        if answer.status != 201:
            raise RuntimeError(f"session not created: {answer.status} {body}")
        return body["id"]


class Opened(NamedTuple):
    """One session opened: its client, and the seconds from the start of the opening until
    it was created, its socket said hello, its first prompt was stored and answered."""

    client: Client
    created: float
    connected: float
    stored: float
    answered: float


async def open_one(
    server: Server, cookie: str, started: float, on_stored: Callable[[], None]
) -> Opened:
    """Create a session, connect, resume and send a first prompt (see `Opened`); call
    `on_stored` once the prompt is stored."""
    session_id = await create_session(server, cookie)
    created = time.perf_counter() - started
    client = await Client.open(server, cookie, session_id)
    connected = time.perf_counter() - started
    await client.send({"type": "resume", "after": 0})
    prompt_id = uuid.uuid4().hex
    await client.send({"type": "prompt", "id": prompt_id, "text": FOLLOW_UP})
    stored = None
    while True:
        frame = await client.frame(wait=120)
        if frame["type"] == "error":
            raise RuntimeError(f"prompt refused: {frame}")
        kind = frame.get("kind")
        if kind == "user_message" and frame["data"].get("id") == prompt_id:
            stored = time.perf_counter() - started
            on_stored()
        elif kind == "turn_end" and stored is not None:
            if frame["data"].get("stop_reason") != "end_turn":
                raise RuntimeError(f"turn ended badly: {frame}")
            return Opened(client, created, connected, stored, time.perf_counter() - started)


async def one_at_a_time(site: Site, count: int) -> dict[str, float]:
    """Open `count` sessions of a new user one after another on a daphne of their own (after
    WARM_UP untimed); return daphne's CPU seconds per session and the medians of prompt
    stored and answered (see `Opened`)."""
    from sandboxes.services import provision_sandbox

    user, cookie = site.user(f"serial-{uuid.uuid4().hex[:6]}")
    provision_sandbox(user)
    clients: list[Client] = []
    with site.serve("--ping-interval", "600") as server:
        try:
            for _ in range(WARM_UP):
                one = await open_one(server, cookie, time.perf_counter(), lambda: None)
                clients.append(one.client)
            before = cpu_seconds({server.process.pid})
            opened = []
            for _ in range(count):
                one = await open_one(server, cookie, time.perf_counter(), lambda: None)
                clients.append(one.client)
                opened.append(one)
            used = cpu_seconds({server.process.pid}) - before
        finally:
            await asyncio.gather(*(client.close() for client in clients))
    return {
        "cpu": used / count,
        "stored_p50": percentile([one.stored for one in opened], 50),
        "answered_p50": percentile([one.answered for one in opened], 50),
    }


async def one_user_in_tens(site: Site, count: int) -> dict[str, float]:
    """Open `count` sessions of one new user, AT_ONCE at a time, on a daphne of their own (its
    sandbox running, provisioned untimed; room for all their agents): each created, its
    socket connected and resumed, a first prompt sent and answered, its socket then closed;
    return the seconds until every one is answered, and the median session's."""
    from sandboxes.services import provision_sandbox

    user, cookie = site.user(f"tens-{uuid.uuid4().hex[:6]}")
    provision_sandbox(user)
    room = str(count + 50)
    places = asyncio.Semaphore(AT_ONCE)
    times: list[float] = []

    async def one(server: Server) -> None:
        async with places:
            began = time.perf_counter()
            opened = await open_one(server, cookie, began, lambda: None)
            times.append(opened.answered)
            await opened.client.close()

    env = {"CRAFT_MAX_AGENTS_PER_USER": room, "CRAFT_MAX_AGENT_CONNECTIONS": room}
    with site.serve("--ping-interval", "600", **env) as server:
        began = time.perf_counter()
        await asyncio.gather(*(one(server) for _ in range(count)))
        took = time.perf_counter() - began
    floor = await asyncio.to_thread(agents_in_tens, user, count)
    return {"seconds": took, "session_p50": percentile(times, 50), "floor": floor}


def agents_in_tens(user: Any, count: int) -> float:
    """The floor of `one_user_in_tens`: `count` cold agents in the user's sandbox, started
    by the backend in this process as Craft starts one (its jail, network and budget, at most
    CRAFT_LOCAL_AGENT_STARTS starting at once), AT_ONCE at a time, each given the same first
    prompt and answered; no web server, no database. Return the seconds until every one is
    answered (they are stopped afterwards, untimed)."""
    from concurrent.futures import ThreadPoolExecutor

    from sandboxes.models import Sandbox
    from sandboxes.services import start_agent_connection
    from tests.sandboxes.agents import run_turn

    sandbox = Sandbox.objects.live().owned_by(user).get()
    started = []

    def one(_: int) -> None:
        connection = start_agent_connection(sandbox, uuid.uuid4())
        started.append(connection)
        if not run_turn(connection, FOLLOW_UP):
            raise RuntimeError("a floor agent did not answer")

    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            began = time.perf_counter()
            list(pool.map(one, range(count)))
            return time.perf_counter() - began
    finally:
        for connection in started:
            connection.stop()


async def warm_agents_waiting(homes: list[Path]) -> float:
    """Wait (untimed) until a process works in each sandbox home: its warm agent; return
    the seconds it took."""
    started = time.monotonic()
    while True:
        found = await asyncio.to_thread(working_in, homes)
        if all(found.values()):
            await asyncio.sleep(1.0)  # its process is there before it is initialized
            return time.monotonic() - started
        if time.monotonic() - started > WARM_WAIT:
            missing = sum(1 for pids in found.values() if not pids)
            raise RuntimeError(f"{missing} sandboxes have no warm agent")
        await asyncio.sleep(0.25)


async def sessions_on_workers(
    servers: list[Server], cookies: list[str], homes: list[Path], count: int
) -> dict[str, Any]:
    """Open `count` sessions, their sockets (and so their agents) spread over `servers` in
    turn, and stream them all at once."""
    pids = {server.process.pid for server in servers}
    note(f"daphne pids {sorted(pids)}: opening {count} sessions")
    # The CPU spent until every first prompt is stored (the opening), whoever spent it.
    opening_split = CpuSplit(pids, set())
    opening_cpu: dict[str, float] = {}
    waiting = count

    def on_stored() -> None:
        nonlocal waiting
        waiting -= 1
        if not waiting:
            opening_cpu.update(opening_split.stop())

    started = time.perf_counter()
    opening_split.start()
    opened = await asyncio.gather(
        *(
            open_one(servers[i % len(servers)], cookies[i // PER_USER], started, on_stored)
            for i in range(count)
        )
    )
    clients = [one.client for one in opened]
    created = max(one.created for one in opened)
    connected = max(one.connected for one in opened)
    stored = max(one.stored for one in opened)
    answered = max(one.answered for one in opened)
    note(
        f"opened {count} sessions: every one created {created:.1f} s, connected "
        f"{connected:.1f} s, prompt stored {stored:.1f} s, answered {answered:.1f} s"
    )
    waited = await warm_agents_waiting(homes)
    note(f"warm agents waiting after {waited:.1f} s; streaming")
    split = CpuSplit(pids, set().union(*(descendants(pid) for pid in pids)))
    split.start()
    prompts_stored: list[float] = []
    results = await asyncio.gather(*(follow(c, SLOW, stored=prompts_stored) for c in clients))
    used = split.stop()
    note("streamed")
    await asyncio.gather(*(c.close() for c in clients))
    return {
        **stream_summary(results, SLOW_CHUNKS),
        "opening": stored,
        "opening_cpu": opening_cpu,
        "answered": answered,
        "opening_p50": percentile([one.stored for one in opened], 50),
        "created": created,
        "connected": connected,
        "stored_p99": percentile(prompts_stored, 99),
        "cpu": used,
    }


async def run(
    site: Site, sessions: int, cluster_sessions: int = CLUSTER_SESSIONS, workers: int = WORKERS
) -> list[Figure]:
    """N sessions on one worker; on PostgreSQL also `cluster_sessions` over `workers`."""
    figures = await measure(site, sessions, 1)
    if site.database != "postgresql":
        skipped = Figure(
            f"{workers} workers (needs PostgreSQL)", float("nan"), "", "-", None,
            "set BENCH_DATABASE_URL",
        )  # fmt: skip
        return [*figures, skipped]
    return figures + await measure(site, cluster_sessions, workers)


async def measure(site: Site, sessions: int, workers: int) -> list[Figure]:
    from sandboxes.services import provision_sandbox

    files = raise_open_files_limit()
    users = [site.user(f"scale-{uuid.uuid4().hex[:6]}") for _ in range(-(-sessions // PER_USER))]
    for user, _ in users:
        provision_sandbox(user)  # here, untimed: the figures are about sessions
    homes = [site.home_of(user) for user, _ in users]
    cookies = [cookie for _, cookie in users]
    serial = tens = None
    if workers == 1:
        note(f"{ONE_AT_A_TIME} sessions opened one at a time")
        serial = await one_at_a_time(site, ONE_AT_A_TIME)
        note(f"{sessions} sessions of one user, {AT_ONCE} at a time")
        tens = await one_user_in_tens(site, sessions)
    load = os.getloadavg()[0]
    note(f"floor: {sessions} agents direct")
    floor = await direct_floor(site.workdir, sessions)
    note(f"floor: gap p99 {floor['gap_p99'] * 1000:.0f} ms; {sessions} sessions through Craft")
    env = {"CRAFT_MAX_AGENT_CONNECTIONS": str(sessions + 2 * len(users) + 50)}
    if workers > 1:
        env |= CLUSTER  # they meet through Redis
    # The client reads no socket while it waits for warm agents: daphne's pings (every 20 s,
    # closing a socket that has not answered within 30 s) would close them meanwhile.
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(site.serve("--ping-interval", "600", **env)) for _ in range(workers)
        ]
        craft = await sessions_on_workers(servers, cookies, homes, sessions)
    added_gap = craft["gap_p99"] - floor["gap_p99"]
    added_first = craft["first_p99"] - floor["first_p99"]
    # "Saturated": the agents alone leave less than the 50 ms Craft may add under the target.
    saturated = floor["gap_p99"] > GAP_TARGET - ADDED_TARGET
    # Chunks that pile up and arrive together have short gaps: the gaps hold only if no
    # chunk came later than a first chunk may (or than the floor's, and 50 ms, saturated).
    in_time = craft["late_p99"] <= max(FIRST_TARGET, floor["late_p99"] + ADDED_TARGET)
    gap_held = in_time and (
        craft["gap_p99"] <= GAP_TARGET or (saturated and added_gap <= ADDED_TARGET)
    )
    first_held = craft["first_p99"] <= FIRST_TARGET or (
        floor["first_p99"] > FIRST_TARGET - ADDED_TARGET and added_first <= ADDED_TARGET
    )
    ms = 1000
    name = f"{sessions} sessions" + (f" on {workers} workers" if workers > 1 else "")
    detail = f"errors {craft['errors']}; floor {floor['gap_p99'] * ms:.0f} ms"
    detail += " (saturated)" if saturated else ""
    if workers > 1:  # the target for several workers is the gap alone: the rest here
        detail += (
            f"; first chunk p99 {craft['first_p99'] * ms:.0f} ms; lateness p99 "
            f"{craft['late_p99'] * ms:.0f} ms (floor {floor['late_p99'] * ms:.0f})"
        )
    gap = Figure(
        f"{name}: gap p99",
        craft["gap_p99"] * ms,
        "ms",
        "<= 150 ms, late <= 300 ms (saturated: floor + 50)",
        gap_held and craft["errors"] == 0,
        f"{detail}; load {load:.1f} before the run",
    )
    if workers > 1:
        return [
            gap,
            Figure(
                f"{name}: opening (create, connect, prompt)",
                craft["opening"],
                "s",
                "-",
                None,
                f"every first prompt answered {craft['answered']:.1f} s; daphnes' CPU while "
                f"streaming: {cores(craft['cpu'])}; floor: {cores(floor['cpu'])}",
            ),
        ]
    assert serial is not None and tens is not None
    return [
        Figure(
            f"{sessions} sessions of one user, {AT_ONCE} at a time: opened and answered",
            tens["seconds"],
            "s",
            f"<= {TENS_TARGET:g} s",
            tens["seconds"] <= TENS_TARGET,
            f"each created, connected, prompted and answered (median session "
            f"{tens['session_p50'] * ms:.0f} ms), on a daphne of its own; floor (the same "
            f"agents started and answered without Craft's server) {tens['floor']:.1f} s",
        ),
        Figure(
            f"{ONE_AT_A_TIME} sessions opened one at a time: daphne CPU per session",
            serial["cpu"] * ms,
            "ms",
            "-",
            None,
            f"median prompt stored {serial['stored_p50'] * ms:.1f} ms, answered "
            f"{serial['answered_p50'] * ms:.0f} ms; no floor (without Craft, no server)",
        ),
        gap,
        Figure(
            f"{name}: first chunk p99",
            craft["first_p99"] * ms,
            "ms",
            "<= 300 ms (saturated: floor + 50)",
            first_held,
            f"floor {floor['first_p99'] * ms:.0f} ms; includes the agent's own 50 ms; "
            f"prompt stored p99 {craft['stored_p99'] * ms:.0f} ms",
        ),
        Figure(
            f"{name}: gap p99 added to the floor's",
            added_gap * ms,
            "ms",
            "-",
            None,
            f"first chunk p99 added {added_first * ms:.0f} ms",
        ),
        Figure(
            f"{name}: chunk lateness p99",
            craft["late_p99"] * ms,
            "ms",
            "-",
            None,
            f"floor {floor['late_p99'] * ms:.0f} ms; a chunk's arrival after the prompt "
            "minus the agent's schedule (50 ms per chunk)",
        ),
        Figure(
            f"{name}: opening (create, connect, prompt)",
            craft["opening"],
            "s",
            "<= 5 s",
            craft["opening"] <= OPENING_TARGET,
            f"until every first prompt is stored (every session created {craft['created']:.1f} s,"
            f" connected {craft['connected']:.1f} s); median session {craft['opening_p50']:.2f} s;"
            f" CPU meanwhile, cores: {opening_cores(craft['opening_cpu'])}",
        ),
        Figure(
            f"{name}: every first prompt answered",
            craft["answered"],
            "s",
            "-",
            None,
            f"{sessions} cold agent starts, CRAFT_LOCAL_AGENT_STARTS default ({os.cpu_count()})",
        ),
        Figure(
            f"{name}: floor (agents direct): gap p99",
            floor["gap_p99"] * ms,
            "ms",
            "-",
            None,
            f"first chunk p99 {floor['first_p99'] * ms:.0f} ms, errors {floor['errors']}",
        ),
        Figure(
            f"{name}: daphne CPU while streaming",
            craft["cpu"]["server"],
            "cores",
            "-",
            None,
            f"{cores(craft['cpu'])}; floor: {cores(floor['cpu'])}; open files {files}",
        ),
    ]


def main(argv: Any = None) -> None:
    run_alone(
        __doc__.splitlines()[0], run, argv,
        sessions=SESSIONS, cluster_sessions=CLUSTER_SESSIONS, workers=WORKERS,
    )  # fmt: skip


if __name__ == "__main__":
    main()
