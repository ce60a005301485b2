"""What the real-agent tests share: the agent's marks and settings, turns through the
websocket (permissions answered, a cancel), the tool call cards they showed, a kill of the
agent and its restart, and the stored log."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from craft.models import Event
from craft.storage.db import db_sync_to_async
from craft.turns.registry import runners
from sandboxes.agent.connection import AgentConnection
from tests.ready import open_ready_session

from ..craft.wsclient import is_turn_end, open_socket, receive_until, session_cookie

# PATH for an agent that node runs (its launcher, or the agent itself).
NODE_PATH = f"{Path(shutil.which('node') or '/usr/bin/node').parent}:/usr/bin:/bin"
# The page's fold of events (what a person reads), run by Node on what a real agent caused.
SESSION_SCRIPTS = Path(__file__).parents[2] / "static" / "craft" / "session"
READ_AS_THE_PAGE = """
const { createFold } = await import(process.argv[2]);
const { workspacePaths } = await import(process.argv[3]);
const fold = createFold({ paths: workspacePaths("", "") });
const { block } = fold.apply({ seq: 1, kind: "agent_error", data: JSON.parse(process.argv[1]) });
console.log(JSON.stringify({ summary: block.summary, said: block.said, wrote: block.wrote }));
"""


def realagent_marks(installed: Path, name: str) -> list[pytest.MarkDecorator]:
    """Return the marks of a module of one real agent's tests: run by `make test`, a transactional
    database, asyncio, five minutes each, and skipped while `installed` is missing."""
    return [
        pytest.mark.realagent,
        pytest.mark.django_db(transaction=True),
        pytest.mark.asyncio,
        pytest.mark.timeout(300),
        pytest.mark.skipif(
            not installed.exists(), reason=f"{name} is not installed: make realagent"
        ),
    ]


def use_agent(settings, command: list[str], **env: str) -> None:
    """Make `command` the agent of the test's sessions, started with `env` as its whole
    environment, and give it two minutes to start (a real agent's first start is slow)."""
    settings.CRAFT_AGENT_COMMAND = command
    settings.CRAFT_AGENT_START_TIMEOUT = 120
    settings.CRAFT_AGENT_ENV = env


@db_sync_to_async
def log_of(session) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in Event.objects.filter(session=session).order_by("seq")]


async def stored_prompts(session) -> tuple[list[str], list[str]]:
    """Return the person's prompts as the log keeps them, and the texts of the user message
    chunks it keeps (an agent's replay of those prompts, stored again)."""
    log = await log_of(session)
    prompts = [data["text"] for kind, data in log if kind == "user_message"]
    replayed = [data["content"]["text"] for kind, data in log if kind == "user_message_chunk"]
    return prompts, replayed


async def turn(comm, prompt_id: str, text: str) -> tuple[list[dict], str]:
    """Send a prompt; return the frames up to its turn's end, and the agent's reply text."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames = await receive_until(comm, is_turn_end, timeout=180)
    return frames, reply_of(frames)


def as_the_page_reads(error: dict) -> dict:
    """Return what the session page tells a person of this `agent_error`: its `summary`, what
    the agent `said` and the line of its stderr the page quotes (`wrote`)."""
    node = shutil.which("node")
    assert node is not None
    scripts = [(SESSION_SCRIPTS / name).as_uri() for name in ("fold.mjs", "paths.mjs")]
    done = subprocess.run(
        [node, "--input-type=module", "-e", READ_AS_THE_PAGE, json.dumps(error), *scripts],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def is_permission_request(frame: dict) -> bool:
    return frame.get("type") == "event" and frame.get("kind") == "permission_request"


async def turn_allowing(comm, prompt_id: str, text: str) -> tuple[list[dict], str]:
    """Send a prompt and answer each permission request it raises with the agent's
    `allow_once` option, as a person pressing Allow; return the frames up to the turn's end
    and the agent's reply text."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames: list[dict] = []
    while not frames or not is_turn_end(frames[-1]):
        frames += await receive_until(
            comm, lambda f: is_turn_end(f) or is_permission_request(f), timeout=180
        )
        if is_permission_request(frames[-1]):
            request = frames[-1]["data"]
            (allow,) = [o for o in request["options"] if o["kind"] == "allow_once"]
            await comm.send_json_to(
                {"type": "permission", "request": request["request"], "option": allow["optionId"]}
            )
    return frames, reply_of(frames)


def reply_of(frames: list[dict]) -> str:
    return "".join(
        f["data"]["content"].get("text", "")
        for f in frames
        if f.get("kind") == "agent_message_chunk" and isinstance(f["data"].get("content"), dict)
    )


def tool_cards(frames: list[dict]) -> dict[str, dict]:
    """Fold the tool_call and tool_call_update events into one card per tool call, as the
    page does: each update's fields replace the card's (content included)."""
    cards: dict[str, dict] = {}
    for frame in frames:
        if frame.get("kind") in ("tool_call", "tool_call_update"):
            data = frame["data"]
            cards.setdefault(data["toolCallId"], {}).update(data)
    return cards


async def cancel_a_slow_turn(comm, prompt_id: str) -> list[dict]:
    """Prompt `slow` (the fake model then streams a word every quarter second), cancel once
    the first words arrived, and return the frames up to the turn's end."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": "slow"})
    seen: list[dict] = []

    def begun(frame: dict) -> bool:
        # The answer so far, not one frame: an agent may split or merge the model's words.
        seen.append(frame)
        return "Slowly" in reply_of(seen) or is_turn_end(frame)

    frames = await receive_until(comm, begun, timeout=120)
    assert not is_turn_end(frames[-1]), f"ended before a cancel: {reply_of(frames)[:300]!r}"
    await comm.send_json_to({"type": "cancel"})
    frames += await receive_until(comm, is_turn_end, timeout=60)
    return frames


def agent_name(frames: list[dict]) -> str:
    """Return the name the agent gave itself in the one agent_info event of these frames."""
    (info,) = [f["data"] for f in frames if f.get("kind") == "agent_info"]
    return info["agent"]["name"]


async def cancelled_mid_turn_then_answered(comm, prefix: str) -> None:
    """Cancel a slow turn once its first words arrived, then prompt again: the cancel ends
    the turn early (the fake model's stream cut short) and the agent still answers. Prompt
    ids start with `prefix`."""
    frames = await cancel_a_slow_turn(comm, f"{prefix}1")
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}
    assert "word80" not in reply_of(frames)
    frames, reply = await turn(comm, f"{prefix}2", "hello again")
    assert reply == "Echo: hello again"
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}


def agent_connection(session) -> AgentConnection:
    """Return the connection to the agent process of the session's runner."""
    connection = runners.get(session.pk).connection
    assert connection is not None
    return connection


async def kill(connection: AgentConnection) -> None:
    """SIGKILL the agent's process and wait until its connection saw it go."""
    os.kill(connection.process.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    await asyncio.to_thread(connection.wait_closed, 10)


async def remember_mango(comm, session, prefix: str) -> AgentConnection:
    """Ask the agent to remember a word (prompt id `<prefix>1`); return its connection."""
    _, reply = await turn(comm, f"{prefix}1", "remember mango")
    assert reply == "I will remember mango."
    return agent_connection(session)


async def recall_mango(comm, session, prefix: str, restored: str) -> None:
    """Ask the agent, killed since `remember_mango`, to recall (prompt id `<prefix>2`): it is
    restarted with its conversation `restored` ("resume" or "load"), answers from it, and
    nothing it replayed is stored again."""
    frames, reply = await turn(comm, f"{prefix}2", "recall")
    assert restarts(frames) == [restored], kinds_and_data(frames)
    assert reply == "You asked me to remember: mango."
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    prompts, replayed = await stored_prompts(session)
    assert replayed == []
    assert prompts == ["remember mango", "recall"]


def restarts(frames: list[dict]) -> list[str]:
    """Return how each agent restart in these frames got its conversation back ("resume"
    or "load")."""
    return [f["data"]["restored"] for f in frames if f.get("kind") == "agent_restarted"]


def kinds_and_data(frames: list[dict]) -> list[tuple]:
    """Return the frames' kinds and data, as an assertion's message."""
    return [(f.get("kind"), f.get("data")) for f in frames]


async def start_session(owner, title: str):
    """Open a session in a ready sandbox and its websocket; return both."""
    session = await db_sync_to_async(open_ready_session)(owner, title)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    return session, comm


def workspace_of(session) -> Path:
    return Path(session.sandbox.reference) / "sessions" / str(session.pk)


def write_in_sandbox(session, relative: str, text: str) -> Path:
    """Write `text` to `relative` in the session's sandbox folder, as the sandbox's own user
    would have: the file and the folders made for it belong to that user (the agent, which
    runs as it, may write beside them)."""
    sandbox = Path(session.sandbox.reference)
    owner = sandbox.stat()
    path = sandbox / relative
    for folder in reversed(path.relative_to(sandbox).parents):
        if str(folder) != ".":
            (sandbox / folder).mkdir(mode=0o700, exist_ok=True)
            os.chown(sandbox / folder, owner.st_uid, owner.st_gid)
    path.write_text(text)
    os.chown(path, owner.st_uid, owner.st_gid)
    return path


def live_output(frames: list[dict], tool_call_id: str) -> tuple[list[str], int]:
    """Return the live output chunks (`_meta.terminal_output.data`) of a tool call, in order,
    and how many of them came before the update that completed it."""
    chunks: list[str] = []
    before = None
    for frame in frames:
        data = frame.get("data") or {}
        if frame.get("kind") not in ("tool_call", "tool_call_update"):
            continue
        if data.get("toolCallId") != tool_call_id:
            continue
        output = (data.get("_meta") or {}).get("terminal_output")
        if isinstance(output, dict):
            chunks.append(output.get("data", ""))
        if data.get("status") == "completed" and before is None:
            before = len(chunks)
    return chunks, len(chunks) if before is None else before
