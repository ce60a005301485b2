"""A two-agent catalog for tests: a plain demo agent, and one that needs a key.

`env_agent` prints its environment when asked (tests/agents/env_agent.py), so tests can see
what reached a real agent process.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

AGENTS = Path(__file__).parent / "agents"
KEY = "PROVIDER_API_KEY"


def catalog() -> list[dict[str, Any]]:
    """Return the catalog as `craft.settings.env_agents_file` makes it."""
    return [
        {
            "id": "demo",
            "title": "Demo agent",
            "command": [sys.executable, "-m", "sandboxes.in_sandbox.demo_agent"],
            "env": {},
            "credentials": [],
        },
        {
            "id": "keyed",
            "title": "Keyed agent",
            "command": [sys.executable, str(AGENTS / "env_agent.py")],
            "env": {},
            "credentials": [
                {"name": KEY, "label": "Provider API key", "help": "https://example.com/keys"}
            ],
        },
    ]


def catalog_toml() -> str:
    """Return the same catalog as a CRAFT_AGENTS_FILE (for a server in another process)."""
    lines = []
    for agent in catalog():
        lines += [
            "[[agents]]",
            f"id = {json.dumps(agent['id'])}",
            f"title = {json.dumps(agent['title'])}",
            f"command = {json.dumps(shlex.join(agent['command']))}",
        ]
        for credential in agent["credentials"]:
            fields = ", ".join(f"{key} = {json.dumps(value)}" for key, value in credential.items())
            lines.append(f"credentials = [{{ {fields} }}]")
        lines.append("")
    return "\n".join(lines)


def write_catalog(folder: Path) -> Path:
    """Write the catalog as a CRAFT_AGENTS_FILE in `folder`; return its path."""
    path = folder / "agents.toml"
    path.write_text(catalog_toml())
    return path
