"""An agent's line parsed as `json.loads` would: the same value, down to each number's type, or
the same refusal (`sandboxes.agent.protocol.parse_line` takes orjson's faster way when that
gives it)."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxes.agent.protocol import parse_line

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 5, max_value=2**64 + 5)
    | st.integers(max_value=-(2**63) + 5, min_value=-(2**63) - 5)
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
LINES = (
    st.builds(json.dumps, VALUES, ensure_ascii=st.booleans()).map(lambda text: text.encode())
    | st.binary(max_size=40)
    | st.integers(min_value=1, max_value=3000).map(lambda n: b"[" * n + b"]" * n)
)


def same(a, b) -> bool:
    """Equal, with the same types all the way down (1 is not 1.0; NaN is NaN)."""
    pairs = [(a, b)]  # a stack, not recursion: some lines nest thousands deep
    while pairs:
        x, y = pairs.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pairs += zip(x, y, strict=True)
        elif isinstance(x, dict):
            if list(x) != list(y):
                return False
            pairs += [(x[k], y[k]) for k in x]
        elif x != y:
            return False
    return True


def outcome(parse, line: bytes):
    try:
        return "value", parse(line)
    except (ValueError, RecursionError) as exc:
        return "refused", type(exc)


@settings(max_examples=2000, deadline=None)
@given(line=LINES)
def test_a_line_parses_as_json_loads_parses_it(line):
    kind, value = outcome(parse_line, line)
    expected_kind, expected = outcome(lambda b: json.loads(b.decode("utf-8", "replace")), line)
    assert kind == expected_kind
    assert same(value, expected) if kind == "value" else value == expected
