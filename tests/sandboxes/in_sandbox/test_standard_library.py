"""The programs that run inside a sandbox import the standard library only.

The backends copy each of `sandboxes/in_sandbox/`'s programs, alone, into a sandbox's tools or
the sandbox image, and run it with a Python that has nothing installed (`-I -S`): an import of
Craft, Django or any other package would fail there, and only there. Each file is parsed,
nothing imported, and every import, at module level or inside a function, is held against
`sys.stdlib_module_names`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

IN_SANDBOX = Path(__file__).resolve().parents[3] / "sandboxes" / "in_sandbox"
PROGRAMS = sorted(path for path in IN_SANDBOX.glob("*.py") if path.name != "__init__.py")


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """Return the top-level name of every module a file imports, with the line of each."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # A relative import reaches the package, which is not copied into the sandbox.
            found.append(("." * node.level + (node.module or "").split(".")[0], node.lineno))
    return found


def test_the_three_programs_are_checked():
    assert [path.name for path in PROGRAMS] == ["demo_agent.py", "git_tool.py", "workspace_tool.py"]


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda path: path.name)
def test_a_program_that_runs_in_a_sandbox_imports_only_the_standard_library(path):
    imports = imported_modules(path)
    assert imports, "no import found: the check is reading the wrong thing"
    others = [
        f"{name} (line {line})" for name, line in imports if name not in sys.stdlib_module_names
    ]
    assert others == []


def test_the_check_tells_a_package_from_the_standard_library(tmp_path):
    program = tmp_path / "program.py"
    program.write_text(
        "import json\ndef f():\n    from django.conf import settings\nfrom . import x\n"
    )
    names = sorted(name for name, _ in imported_modules(program))
    assert names == [".", "django", "json"]
    assert [n for n in names if n not in sys.stdlib_module_names] == [".", "django"]
