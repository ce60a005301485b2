"""Websocket frames (RFC 6455) as a client speaks them to the app behind a preview.

The browser's side of a preview's websocket is daphne's; the app's side is this: the opening
handshake, masked frames out, frames in (fragments joined, control frames answered by the
caller), each message at most MAX_MESSAGE bytes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from dataclasses import dataclass

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
# As daphne takes from browsers (`make run`): a message of up to 4 MiB.
MAX_MESSAGE = 4 << 20


class FrameError(Exception):
    """The app broke the protocol (or sent a message too large)."""


@dataclass(frozen=True)
class Message:
    opcode: int  # TEXT, BINARY, CLOSE, PING or PONG
    payload: bytes


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode("ascii")


def accept_for(key: str) -> str:
    """Return the Sec-WebSocket-Accept a server must answer `key` with."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + GUID).digest()).decode("ascii")


def encode(opcode: int, payload: bytes) -> bytes:
    """Return one final, masked frame (a client's frames are masked)."""
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    mask = os.urandom(4)
    return head + mask + _masked(payload, mask)


def close_payload(code: int | None) -> bytes:
    return b"" if code is None else struct.pack("!H", code)


def close_code(payload: bytes) -> int | None:
    """Return the code of a close frame's payload (None: it gave none)."""
    return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None


async def read_message(reader: asyncio.StreamReader) -> Message:
    """Return the next message or control frame from the app. Raise FrameError when it breaks
    the protocol, asyncio.IncompleteReadError when the connection ends."""
    parts: list[bytes] = []
    size = 0
    first_opcode = None
    while True:
        head = await reader.readexactly(2)
        fin, opcode = head[0] & 0x80, head[0] & 0x0F
        masked, length = head[1] & 0x80, head[1] & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await reader.readexactly(8))
        mask = await reader.readexactly(4) if masked else b""
        if opcode >= CLOSE:
            if not fin or length > 125:
                raise FrameError("a control frame was fragmented or too long")
            payload = await reader.readexactly(length)
            return Message(opcode, _masked(payload, mask) if mask else payload)
        if size + length > MAX_MESSAGE:
            raise FrameError("a message was too large")
        if (opcode == CONTINUATION) != (first_opcode is not None):
            raise FrameError("a fragment came out of order")
        if first_opcode is None:
            if opcode not in (TEXT, BINARY):
                raise FrameError(f"unknown opcode {opcode}")
            first_opcode = opcode
        payload = await reader.readexactly(length)
        parts.append(_masked(payload, mask) if mask else payload)
        size += length
        if fin:
            return Message(first_opcode, b"".join(parts))


def _masked(data: bytes, mask: bytes) -> bytes:
    if not data:
        return data
    key = int.from_bytes((mask * (len(data) // 4 + 1))[: len(data)], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(len(data), "big")
