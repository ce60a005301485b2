"""Fold a session's event log into what a person reads: messages, tool cards, a plan."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .models import Event


@dataclass
class Block:
    """One piece of the transcript; `seqs` are the events folded into it."""

    kind: str  # user, agent, thought, tool, plan, permission, turn_end, error, other
    seqs: list[int] = field(default_factory=list)
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def _text_of(update: dict[str, Any]) -> str:
    content = update.get("content")
    if isinstance(content, dict) and content.get("type") == "text":
        return str(content.get("text", ""))
    return ""


def build_transcript(events: Iterable[Event]) -> list[Block]:
    """Return the blocks of a transcript, in order, each event folded into exactly one."""
    blocks: list[Block] = []
    tools: dict[str, Block] = {}
    plan: Block | None = None
    for event in events:
        kind, data = event.kind, event.data
        last = blocks[-1] if blocks else None
        if kind == "user_message":
            blocks.append(Block("user", [event.seq], text=str(data.get("text", ""))))
        elif kind in ("agent_message_chunk", "agent_thought_chunk"):
            block_kind = "agent" if kind == "agent_message_chunk" else "thought"
            if last is not None and last.kind == block_kind:
                last.seqs.append(event.seq)
                last.text += _text_of(data)
            else:
                blocks.append(Block(block_kind, [event.seq], text=_text_of(data)))
        elif kind in ("tool_call", "tool_call_update"):
            tool_id = str(data.get("toolCallId", ""))
            block = tools.get(tool_id)
            if block is None:
                block = Block("tool", [], data={})
                tools[tool_id] = block
                blocks.append(block)
            block.seqs.append(event.seq)
            # tool_call_update carries only changed fields; `content` replaces the old list.
            block.data.update({k: v for k, v in data.items() if v is not None})
        elif kind == "plan":
            # A plan always carries the complete list: the newest replaces the old one.
            if plan is None:
                plan = Block("plan", [])
                blocks.append(plan)
            plan.seqs.append(event.seq)
            plan.data = {"entries": list(data.get("entries") or [])}
        elif kind == "permission_request":
            blocks.append(Block("permission", [event.seq], data=dict(data)))
        elif kind == "permission_answer":
            for block in reversed(blocks):
                if block.kind == "permission" and block.data.get("request") == data.get("request"):
                    block.seqs.append(event.seq)
                    block.data["answer"] = data.get("option")
                    break
            else:
                blocks.append(Block("other", [event.seq], data={"kind": kind, **data}))
        elif kind == "turn_end":
            blocks.append(Block("turn_end", [event.seq], text=str(data.get("stop_reason", ""))))
        elif kind == "agent_error":
            blocks.append(Block("error", [event.seq], text=str(data.get("message", ""))))
        else:
            blocks.append(Block("other", [event.seq], data={"kind": kind}))
    return blocks
