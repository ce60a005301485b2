"""Small ACP agents that misbehave in ways the demo agent does not (standard library only)."""

from __future__ import annotations

import shutil
from pathlib import Path

AGENTS = Path(__file__).parent


def agent_command(name: str, folder: Path, python: str) -> list[str]:
    """Return the argv of tests/agents/<name>.py copied into `folder` and run by `python`.

    The copy makes it readable by sandbox users even when the checkout is not (a clone under
    /root, say); `python` must be one that they can run too.
    """
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    script = folder / f"{name}.py"
    shutil.copyfile(AGENTS / f"{name}.py", script)
    script.chmod(0o644)
    return [python, str(script)]
