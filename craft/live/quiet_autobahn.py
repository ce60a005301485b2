"""Every websocket frame daphne sends goes through autobahn's `sendData`, which formats the
arguments of a debug message before its logger drops it: `hltype` of the method (its module and
qualified name, split and joined again) and `hlval` twice, about 2.4 us a frame, close to a
tenth of daphne's CPU for each event it streams. Those two names serve only as log arguments
in autobahn's websocket module, so `install` gives that module plain versions: a debug log (if
anyone turns autobahn's on) still names the same method and values, without colours.
tests/craft/test_quiet_autobahn.py fails if a new autobahn formats anything for a frame again.
"""

from __future__ import annotations

from typing import Any

import autobahn.websocket.protocol as protocol


def _plain_type(obj: Any) -> Any:
    return obj  # a bound method's repr names its class and function


def _plain_value(value: Any, color: str = "white", bold: bool = True) -> Any:
    return value


def install() -> None:
    protocol.hltype = _plain_type
    protocol.hlval = _plain_value
