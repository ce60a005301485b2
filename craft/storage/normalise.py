"""Make every stored value valid: what agents and clients send is cleaned here, once.

Agents are untrusted and clients are careless: text can hold lone UTF-16 surrogates (Node
agents split emoji that way) or NUL characters, which PostgreSQL refuses in `jsonb` and no
reader can encode as UTF-8. Every event passes through `encode_event` before it is stored, so
each stored event can be replayed and rendered: lone surrogates become U+FFFD, NULs are
removed, a kind that is not a short identifier is replaced, and an agent message too long for
one websocket frame becomes several consecutive chunks whose texts concatenate to the
original. A bad item changes at most itself.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

import orjson

# A session's title column holds at most this many characters.
MAX_TITLE = 200
# Kinds are identifiers: the event column holds at most 64 characters.
MAX_KIND = 64
_KIND = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
INVALID_KIND = "invalid_update"

# An agent text chunk longer than this is stored as several events. JSON escaping can make a
# character up to six bytes (control characters), so a piece always fits in a 1 MiB frame.
SPLIT_CHARS = 100_000
_SPLIT_KINDS = {"agent_message_chunk", "agent_thought_chunk", "user_message_chunk"}


def clean_text(text: str) -> str:
    """Return `text` without NULs, with lone surrogates replaced by U+FFFD.

    Adjacent high and low surrogates (an emoji split across two JSON strings and joined
    again) become the character they encode.
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def clean_title(text: str, limit: int = MAX_TITLE) -> str:
    """Return `text` as a session title: cleaned like every stored text (`clean_text`), on one
    line (each run of whitespace becomes one space), at most `limit` characters; "" when
    nothing is left.

    Every writer of a title goes through it (the owner, the first prompt, the agent):
    PostgreSQL refuses a NUL in a text column, and neither database's driver takes a lone
    surrogate.
    """
    return " ".join(clean_text(text).split())[:limit]


def clean(value: Any) -> Any:
    """Return `value` with every string in it (keys too) cleaned, and the floats JSON has no
    spelling for (infinities and NaN, which Python's parser accepts) replaced by null."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {clean_text(str(k)): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Return compact JSON that both databases accept and every reader can encode.

    orjson writes what `json.dumps` would, several times faster (every streamed event is
    encoded once, on the event writer's thread), except that it spells some floats
    differently (1e-05 as 0.00001: the same number) and writes NaN and the infinities as null,
    as `dumps_clean` does. It refuses what it cannot write as valid UTF-8 JSON (a lone
    surrogate, a key that is not a string, an integer over 64 bits): those take `json`'s way.
    """
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _dumps_json(value)
    # orjson writes a NUL as its escape, which PostgreSQL's jsonb refuses.
    return text if "\\u0000" not in text else dumps_clean(value)


def _dumps_json(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return dumps_clean(value)
    if text.isascii():
        # No surrogate can hide in ASCII; a NUL shows as its escape.
        return text if "\\u0000" not in text else dumps_clean(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return dumps_clean(value)
    return text if "\\u0000" not in text else dumps_clean(value)


def dumps_clean(value: Any) -> str:
    return json.dumps(clean(value), ensure_ascii=False, separators=(",", ":"))


def is_client_id(value: str) -> bool:
    """Whether `value` can be a client's prompt id: 1 to 100 characters, none of them a
    control character or a lone surrogate (it is stored in an indexed text column)."""
    return 0 < len(value) <= 100 and value.isprintable() and clean_text(value) == value


def clean_kind(kind: Any) -> str:
    """Return `kind` if it is a short identifier, else the placeholder kind."""
    if isinstance(kind, str) and len(kind) <= MAX_KIND:
        return _checked_kind(kind)
    return INVALID_KIND


@lru_cache(maxsize=1024)
def _checked_kind(kind: str) -> str:
    return kind if _KIND.fullmatch(kind) else INVALID_KIND


def split_long_text(kind: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the data of one event, or of several if its text is too long for one frame."""
    if kind not in _SPLIT_KINDS:
        return [data]
    content = data.get("content")
    if not isinstance(content, dict) or not isinstance(content.get("text"), str):
        return [data]
    text = content["text"]
    if len(text) <= SPLIT_CHARS:
        return [data]
    return [
        {**data, "content": {**content, "text": text[i : i + SPLIT_CHARS]}}
        for i in range(0, len(text), SPLIT_CHARS)
    ]


def encode_event(kind: str, data: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the (kind, JSON text) pairs to store for one event, in order."""
    kind = clean_kind(kind)
    return [(kind, dumps(piece)) for piece in split_long_text(kind, data)]


@lru_cache(maxsize=256)
def _kind_json(kind: str) -> str:
    return json.dumps(kind)


# Daphne (like most websocket stacks) refuses messages over 1 MiB; keep room for the envelope.
MAX_FRAME_BYTES = 1024 * 1024 - 4096
TRUNCATED_MARK = "… [truncated]"


def event_frame(seq: int, kind: str, data_text: str) -> str:
    """Return the websocket `event` frame of a stored event, built from its stored JSON text.

    An event too big for one frame is sent shortened, with `"truncated": true`; the full
    event stays in the log (and in the HTTP API).
    """
    frame = f'{{"type":"event","seq":{seq},"kind":{_kind_json(kind)},"data":{data_text}}}'
    if len(frame) * 4 > MAX_FRAME_BYTES and len(frame.encode()) > MAX_FRAME_BYTES:
        return json.dumps(
            {"type": "event", "seq": seq, "kind": kind, "data": shorten(json.loads(data_text)),
             "truncated": True},
            ensure_ascii=False, separators=(",", ":"),
        )  # fmt: skip
    return frame


def event_json(seq: int, kind: str, data_text: str, created_at: str) -> str:
    """Return an event as the HTTP API lists it, shortened like `event_frame` if too big."""
    if len(data_text) * 4 > MAX_FRAME_BYTES and len(data_text.encode()) > MAX_FRAME_BYTES:
        short = dumps(shorten(json.loads(data_text)))
        return (
            f'{{"seq":{seq},"kind":{_kind_json(kind)},"data":{short},'
            f'"created_at":"{created_at}","truncated":true}}'
        )
    return (
        f'{{"seq":{seq},"kind":{_kind_json(kind)},"data":{data_text},"created_at":"{created_at}"}}'
    )


def shorten(data: Any, budget: int = MAX_FRAME_BYTES - 1024) -> Any:
    """Return `data` with long strings and lists cut until its JSON fits in `budget` bytes."""
    chars, items = 65_536, 1_000
    while True:
        short = _cut(data, chars, items)
        if len(dumps(short).encode()) <= budget or chars <= 64:
            return short
        chars, items = chars // 2, max(1, items // 2)


def _cut(value: Any, chars: int, items: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + TRUNCATED_MARK
    if isinstance(value, dict):
        return {k: _cut(v, chars, items) for k, v in list(value.items())[:items]}
    if isinstance(value, list):
        return [_cut(v, chars, items) for v in value[:items]]
    return value
