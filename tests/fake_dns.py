"""A tiny DNS server on a loopback address, for tests of name resolution from sandboxes.

It answers every A question with one address (and nothing for other types), as a local
resolver (systemd-resolved's 127.0.0.53, dnsmasq) would answer a name it knows, and keeps
the names it was asked. Standard library only; UDP only.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Self


class FakeDns:
    """Serve on `host`:53 (UDP) on a thread while in a `with` block; `asked` lists names."""

    def __init__(self, host: str, address: str) -> None:
        self.host = host
        self.address = socket.inet_aton(address)
        self.asked: list[str] = []

    def __enter__(self) -> Self:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.host, 53))
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:
                return
            answer = self._answer(query)
            if answer:
                self.sock.sendto(answer, peer)

    def _answer(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        ident, _flags, questions = struct.unpack("!HHH", query[:6])
        if questions != 1:
            return None
        labels, position = [], 12
        while position < len(query) and query[position]:
            length = query[position]
            labels.append(query[position + 1 : position + 1 + length].decode(errors="replace"))
            position += 1 + length
        question = query[12 : position + 5]
        qtype = struct.unpack("!H", query[position + 1 : position + 3])[0]
        self.asked.append(".".join(labels))
        header = struct.pack("!HHHHHH", ident, 0x8180, 1, 1 if qtype == 1 else 0, 0, 0)
        if qtype != 1:
            return header + question
        record = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + self.address
        return header + question + record
