"""What an agent's `elicitation/create` asks, checked, and what a person answers, checked.

ACP's elicitation (v1, after MCP's) asks the person for information in one of two modes: a
form whose `requestedSchema` is a flat JSON Schema object of primitive fields, or a URL the
person opens. Agents are untrusted: a form is read into a list of plain field descriptions
(`read_form`) that a page can draw without interpreting JSON Schema, bounded in size, and a
person's answer is checked against those fields (`check_content`) before the agent hears it.

A field is `{"name", "type", "title", "description", "required", ...}` where `type` is one of
`string`, `number`, `integer`, `boolean`, `enum` (a single choice: `options` is a list of
`{"value", "title"}`) or `unsupported` (any other type, `array` included: shown, never
answered; a required one means the form can only be declined).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

# A form with more fields than this is refused whole (the agent gets an error saying so):
# nobody fills in a thousand fields, and the page must stay responsive.
MAX_FIELDS = 100
MAX_OPTIONS = 200  # choices of one enum field; more are refused with the form
MAX_TEXT = 2_000  # characters of a title, a description or a message shown
MAX_VALUE_CHARS = 10_000  # characters of one string answer
MAX_URL = 4_000


class BadRequest(ValueError):
    """The agent's request cannot be shown; the message says why, for the agent and the log."""


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def read_form(schema: Any) -> list[dict[str, Any]]:
    """Return the fields of a form's `requestedSchema`; raise BadRequest if it has none to
    show or is too big."""
    if not isinstance(schema, dict):
        raise BadRequest("requestedSchema must be an object")
    properties = schema.get("properties")
    properties = {} if properties is None else properties
    if not isinstance(properties, dict):
        raise BadRequest("requestedSchema.properties must be an object")
    if len(properties) > MAX_FIELDS:
        raise BadRequest(
            f"the form has {len(properties)} fields; Craft shows forms of at most {MAX_FIELDS}"
        )
    required = schema.get("required")
    required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    return [_field(str(name)[:200], spec, name in required) for name, spec in properties.items()]


def _field(name: str, spec: Any, required: bool) -> dict[str, Any]:
    spec = spec if isinstance(spec, dict) else {}
    kind = spec.get("type")
    field: dict[str, Any] = {
        "name": name,
        "type": "unsupported",
        "title": _text(spec.get("title")) or name,
        "description": _text(spec.get("description")),
        "required": required,
    }
    options = _options(spec) if kind == "string" else None
    if options is not None:
        field["type"] = "enum"
        field["options"] = options
        default = spec.get("default")
        if any(o["value"] == default for o in options):
            field["default"] = default
    elif kind == "string":
        field["type"] = "string"
        for key in ("minLength", "maxLength"):
            value = spec.get(key)
            if type(value) is int and value >= 0:
                field[key] = value
        if isinstance(spec.get("format"), str):
            field["format"] = spec["format"][:40]
        if isinstance(spec.get("default"), str):
            field["default"] = spec["default"][:MAX_VALUE_CHARS]
    elif kind in ("number", "integer"):
        field["type"] = kind
        for key in ("minimum", "maximum", "default"):
            value = _number(spec.get(key))
            if value is not None:
                field[key] = value
    elif kind == "boolean":
        field["type"] = "boolean"
        if isinstance(spec.get("default"), bool):
            field["default"] = spec["default"]
    else:
        field["unsupported"] = str(kind)[:40] if kind is not None else "none"
    return field


def _options(spec: dict[str, Any]) -> list[dict[str, str]] | None:
    """Return the choices of a single-choice string field (`enum` or `oneOf`), else None."""
    raw_enum, raw_one_of = spec.get("enum"), spec.get("oneOf")
    if isinstance(raw_one_of, list):
        options = [
            {"value": o["const"], "title": _text(o.get("title")) or o["const"]}
            for o in raw_one_of
            if isinstance(o, dict) and isinstance(o.get("const"), str)
        ]
    elif isinstance(raw_enum, list):
        names = spec.get("enumNames")
        names = names if isinstance(names, list) else []
        options = [
            {"value": v, "title": _text(names[i]) if i < len(names) and names[i] else v}
            for i, v in enumerate(raw_enum)
            if isinstance(v, str)
        ]
    else:
        return None
    if len(options) > MAX_OPTIONS:
        raise BadRequest(
            f"a field offers {len(options)} choices; Craft shows at most {MAX_OPTIONS}"
        )
    return options


def read_url(url: Any) -> str:
    """Return the URL of a URL-mode request; raise BadRequest unless it is http or https."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise BadRequest(f"url must be a string of 1 to {MAX_URL} characters")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise BadRequest("url is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("Craft opens only http and https URLs")
    return url


def answerable(fields: list[dict[str, Any]]) -> bool:
    """Whether a form can be accepted: no required field is of a type Craft cannot show."""
    return not any(f["type"] == "unsupported" and f["required"] for f in fields)


def check_content(fields: list[dict[str, Any]], content: Any) -> dict[str, Any]:
    """Return a person's accepted form content, checked against the form's fields; raise
    ValueError saying what is wrong."""
    if not isinstance(content, dict):
        raise ValueError("'content' must be an object of the form's field values")
    if not answerable(fields):
        raise ValueError("this form asks for something Craft cannot show: decline it")
    by_name = {f["name"]: f for f in fields}
    for name in content:
        field = by_name.get(name)
        if field is None or (field["type"] == "unsupported" and content[name] is not None):
            raise ValueError(f"the form has no field {name!r}")
    checked: dict[str, Any] = {}
    for field in fields:
        name = field["name"]
        if name not in content or content[name] is None:
            if field["required"]:
                raise ValueError(f"{field['title']!r} is required")
            continue
        checked[name] = _value(field, content[name])
    return checked


def _value(field: dict[str, Any], value: Any) -> Any:
    kind, title = field["type"], field["title"]
    if kind in ("string", "enum"):
        if not isinstance(value, str):
            raise ValueError(f"{title!r} must be text")
        if len(value) > MAX_VALUE_CHARS:
            raise ValueError(f"{title!r} is limited to {MAX_VALUE_CHARS} characters")
        if kind == "enum" and value not in {o["value"] for o in field["options"]}:
            raise ValueError(f"{value!r} is not a choice of {title!r}")
        if kind == "string" and len(value) < field.get("minLength", 0):
            raise ValueError(f"{title!r} needs at least {field['minLength']} characters")
        if kind == "string" and len(value) > field.get("maxLength", MAX_VALUE_CHARS):
            raise ValueError(f"{title!r} allows at most {field['maxLength']} characters")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"{title!r} must be true or false")
        return value
    number = _number(value)
    if number is None or (kind == "integer" and number != int(number)):
        raise ValueError(
            f"{title!r} must be {'a whole number' if kind == 'integer' else 'a number'}"
        )
    if "minimum" in field and number < field["minimum"]:
        raise ValueError(f"{title!r} must be at least {field['minimum']}")
    if "maximum" in field and number > field["maximum"]:
        raise ValueError(f"{title!r} must be at most {field['maximum']}")
    return int(number) if kind == "integer" else number
