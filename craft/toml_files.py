"""Files of settings in TOML that list tables of one kind (`[[agents]]`, `[[hosts]]`)."""

from __future__ import annotations

import tomllib
from typing import Any


def read_tables(name: str, path: str, key: str, error: type[Exception]) -> tuple[list[Any], str]:
    """Return the `[[key]]` tables of the TOML file at `path`, which the setting `name` names,
    and the file's text (to find an entry's line); raise `error` saying what is wrong when it
    cannot be read, is not TOML, holds another key or lists none."""
    try:
        with open(path, "rb") as file:
            text = file.read().decode("utf-8")
        document = tomllib.loads(text)
    except OSError as exc:
        raise error(f"{name}: cannot read {path!r}: {exc.strerror}") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{name}: {path!r} is not valid TOML: {exc}") from exc
    unknown = set(document) - {key}
    if unknown:
        raise error(f"{name}: unknown key {sorted(unknown)[0]!r} (only [[{key}]])")
    tables = document.get(key)
    if not isinstance(tables, list) or not tables:
        raise error(f"{name}: {path!r} lists no [[{key}]]")
    return tables, text
