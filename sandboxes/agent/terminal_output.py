"""Live command output of a turn, held to a size per tool call before anyone keeps it.

Agents send what a running command prints in tool call updates (`_meta.terminal_output.data`).
A command that prints without end would otherwise fill the event log: past `max_bytes` of a
tool call, its output is dropped on the reader thread, and the turn is told once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sandboxes.agent.protocol import Update

# Tool calls followed per turn; a turn of more has the rest of its output let through uncounted.
MAX_TOOL_CALLS = 10_000


class TerminalOutputLimit:
    """Bytes of live output let through per tool call of the running turn."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._used: dict[str, int] = {}  # tool call id -> bytes of output let through

    def reset(self) -> None:
        """Forget the counts: a new turn begins (tool call ids may repeat in a later turn)."""
        self._used.clear()

    def cut(
        self, update: dict[str, Any], deliver: Callable[[Update], None]
    ) -> dict[str, Any] | None:
        """Return a tool call update whose live output keeps the tool call within `max_bytes`,
        or None when nothing else is left of it.

        The first cut is told through `deliver`: what still fits of the output, then a
        `terminal_output_limited` update (the tool call's id and the limit), so that the log
        says that output is missing.
        """
        meta = update.get("_meta")
        output = meta.get("terminal_output") if isinstance(meta, dict) else None
        if not isinstance(output, dict) or not isinstance(output.get("data"), str):
            return update
        assert isinstance(meta, dict)
        tool_call_id = str(update.get("toolCallId"))[:200]
        used = self._used.get(tool_call_id, 0)
        data = output["data"]
        size = len(data.encode("utf-8", "surrogatepass"))
        if used + size <= self.max_bytes:
            if tool_call_id in self._used or len(self._used) < MAX_TOOL_CALLS:
                self._used[tool_call_id] = used + size
            return update
        room = max(self.max_bytes - used, 0)
        self._used[tool_call_id] = self.max_bytes + 1  # over: told once
        if used <= self.max_bytes:
            limited = {"sessionUpdate": "terminal_output_limited", "toolCallId": tool_call_id,
                       "limit": self.max_bytes}  # fmt: skip
            cut = data.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
            if cut:
                meta = {**meta, "terminal_output": {**output, "data": cut}}
                deliver(Update("tool_call_update", {**update, "_meta": meta}))
            deliver(Update("terminal_output_limited", limited))
        rest = {key: value for key, value in meta.items() if key != "terminal_output"}
        others = {k for k in update if k not in ("sessionUpdate", "toolCallId", "_meta")}
        if not rest and not others:
            return None
        return {**update, "_meta": rest}
