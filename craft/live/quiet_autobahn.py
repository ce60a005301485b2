"""Autobahn formats the arguments of its debug messages before its logger drops them.

* Every websocket frame daphne sends goes through autobahn's `sendData`, which formats `hltype`
  of the method (its module and qualified name, split and joined again) and `hlval` twice,
  about 2.4 us a frame, close to a tenth of daphne's CPU for each event it streams.
* Every websocket that connects goes through `_connectionMade`, which pretty-prints its forty
  options (`pformat`), about 0.4 ms a socket: a sixth of daphne's CPU for a socket's opening
  when hundreds connect at once (py-spy --gil, docs/history/performance-diary.md,
  "What a session's opening costs").

Those three names serve only as log arguments in autobahn's websocket module (and `pformat`
in `Timings.__str__`, which keeps it), so `install` gives that module plain versions and a
`pformat` that formats when a log line is written: a debug log (if anyone turns autobahn's on)
still shows the same method, values and options, without colours.
tests/craft/live/test_quiet_autobahn.py fails if a new autobahn formats anything for a frame or a
connection again.
"""

from __future__ import annotations

import pprint
from typing import Any

import autobahn.websocket.protocol as protocol


def _plain_type(obj: Any) -> Any:
    return obj  # a bound method's repr names its class and function


def _plain_value(value: Any, color: str = "white", bold: bool = True) -> Any:
    return value


class _FormattedWhenWritten:
    """`pformat(value)`, computed only if a log line shows it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return pprint.pformat(self.value)


def _timings_text(timings: protocol.Timings) -> str:
    return pprint.pformat(timings._timings)


def install() -> None:
    protocol.hltype = _plain_type
    protocol.hlval = _plain_value
    protocol.pformat = _FormattedWhenWritten  # type: ignore[assignment]
    protocol.Timings.__str__ = _timings_text  # type: ignore[method-assign]
