"""Start real demo-agent processes for tests (no Django needed)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import PermissionRequest, TurnEnd, TurnFailed, TurnItem, Update
from sandboxes.backends.local import LocalAgentProcess, resolve_command

DEMO_AGENT = ["craft-demo-agent"]


def start_demo_agent(workspace: Path, argv: list[str] | None = None) -> AgentConnection:
    """Start the demo agent in `workspace` and open its ACP session."""
    workspace.mkdir(parents=True, exist_ok=True)
    process = LocalAgentProcess(resolve_command(argv or DEMO_AGENT), workspace)
    connection = AgentConnection(process, cwd=str(workspace))
    connection.start(timeout=15)
    return connection


def iter_prompt(
    connection: AgentConnection, text: str, timeout: float | None = None
) -> Iterator[TurnItem]:
    """Run a turn and yield its items as they come (blocking); permission requests must be
    answered. Fails when nothing comes within `timeout`."""
    items: queue.SimpleQueue[TurnItem] = queue.SimpleQueue()
    connection.prompt(text, items.put)
    while True:
        try:
            item = items.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message from the agent within {timeout} s") from None
        yield item
        if isinstance(item, TurnEnd | TurnFailed):
            return


def run_turn(
    connection: AgentConnection, text: str, answer: str | None = "allow", timeout: float = 15
) -> list[TurnItem]:
    """Run a turn to its end, answering permission requests with `answer`; return its items."""
    items = []
    for item in iter_prompt(connection, text, timeout=timeout):
        items.append(item)
        if isinstance(item, PermissionRequest):
            connection.answer_permission(item.request_id, answer)
    return items


def reply_text(items: list[TurnItem]) -> str:
    return "".join(
        item.data["content"]["text"]
        for item in items
        if isinstance(item, Update) and item.kind == "agent_message_chunk"
    )


def ending(items: list[TurnItem]) -> TurnEnd | TurnFailed:
    last = items[-1]
    assert isinstance(last, TurnEnd | TurnFailed)
    return last


def agent_pid(connection: AgentConnection) -> int:
    """Ask the demo agent behind `connection` for its process id (a whole turn)."""
    return int(reply_text(run_turn(connection, "pid")).split()[1])
