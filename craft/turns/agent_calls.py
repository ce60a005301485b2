"""The threads that call agents: starts, prompts, cancels, permission answers, stops.

Blocking and possibly slow (a pod exec handshake takes seconds), so never on the event loop,
and never on the database threads: a slow agent never delays another session's storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from sandboxes.agent.connection import AgentConnection

T = TypeVar("T")

agent_calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="craft-agent-call")


async def call_agent(func: Callable[..., T], *args: Any) -> T:
    """Run blocking agent work on `agent_calls`."""
    return await asyncio.get_running_loop().run_in_executor(agent_calls, func, *args)


async def send_to_agent(connection: AgentConnection, func: Callable[..., T], *args: Any) -> T:
    """Run agent work that only sends to the agent (a prompt, an answer, a cancel): here, when
    the agent's writes never wait (a local pipe), else on `agent_calls`. The hop to a thread
    and back is most of a local prompt's cost to the event loop and, with hundreds of
    sessions prompted at once, a wait behind the other hops for the GIL."""
    if connection.writes_block:
        return await call_agent(func, *args)
    return func(*args)
