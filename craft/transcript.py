"""Fold a session's event log into what a person reads: messages, tool cards, plans.

The page script (static/craft/session.js, `applyEvent`) folds live events the same way, into
the same markup (templates/craft/_block.html), so a reload and a live stream look alike. Every
event leaves exactly one element with its `data-seq` in the page.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .models import Event


@dataclass
class Part:
    seq: int
    text: str


@dataclass
class Block:
    """One piece of the transcript; `parts` hold text pieces, `marks` other folded seqs."""

    kind: str  # user, agent, thought, tool, plan, permission, turn_end, error, other
    parts: list[Part] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.parts)


def _text_of(update: dict[str, Any]) -> str:
    content = update.get("content")
    if isinstance(content, dict) and content.get("type") == "text":
        return str(content.get("text", ""))
    return ""


def build_transcript(events: Iterable[Event]) -> list[Block]:
    """Return the blocks of a transcript, in order, each event folded into exactly one."""
    blocks: list[Block] = []
    tools: dict[str, Block] = {}
    plan: Block | None = None  # one plan per turn, replaced in place
    open_permissions: dict[str, Block] = {}
    for event in events:
        kind, data, seq = event.kind, event.data, event.seq
        last = blocks[-1] if blocks else None
        if kind == "user_message":
            plan = None
            blocks.append(Block("user", [Part(seq, str(data.get("text", "")))]))
        elif kind in ("agent_message_chunk", "agent_thought_chunk"):
            block_kind = "agent" if kind == "agent_message_chunk" else "thought"
            if last is not None and last.kind == block_kind:
                last.parts.append(Part(seq, _text_of(data)))
            else:
                blocks.append(Block(block_kind, [Part(seq, _text_of(data))]))
        elif kind in ("tool_call", "tool_call_update"):
            tool_id = str(data.get("toolCallId", ""))
            block = tools.get(tool_id)
            if block is None:
                block = tools[tool_id] = Block("tool", data={"toolCallId": tool_id})
                blocks.append(block)
            block.marks.append(seq)
            # tool_call_update carries only changed fields; `content` replaces the old list.
            block.data.update({k: v for k, v in data.items() if v is not None})
        elif kind == "plan":
            if plan is None:
                plan = Block("plan")
                blocks.append(plan)
            plan.marks.append(seq)
            plan.data = {"entries": list(data.get("entries") or [])}
        elif kind == "permission_request":
            block = Block("permission", marks=[seq], data=dict(data))
            open_permissions[str(data.get("request"))] = block
            blocks.append(block)
        elif kind == "permission_answer":
            block = open_permissions.pop(str(data.get("request")), None)
            if block is None:
                blocks.append(Block("other", marks=[seq], data={"kind": kind}))
            else:
                block.marks.append(seq)
                block.data["answer"] = data.get("option") or "cancelled"
        elif kind == "turn_end":
            for block in open_permissions.values():
                block.data["answer"] = "expired"
            open_permissions.clear()
            blocks.append(Block("turn_end", [Part(seq, str(data.get("stop_reason", "")))]))
        elif kind == "agent_error":
            blocks.append(Block("error", [Part(seq, str(data.get("message", "")))]))
        else:
            blocks.append(Block("other", marks=[seq], data={"kind": kind}))
    return blocks
