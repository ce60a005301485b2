"""The threads that call agents: starts, prompts, cancels, permission answers, stops.

Blocking and possibly slow (a pod exec handshake takes seconds), so never on the event loop,
and never on the database threads: a slow agent never delays another session's storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

agent_calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="craft-agent-call")


async def call_agent(func: Callable[..., T], *args: Any) -> T:
    """Run blocking agent work on `agent_calls`."""
    return await asyncio.get_running_loop().run_in_executor(agent_calls, func, *args)
