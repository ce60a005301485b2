"""The process's runtime knows every module singleton of `craft` and `sandboxes`.

Each module-level object built from a class (`writer = EventWriter()`) is state that lives
as long as the process. `craft/runtime.py` (or `sandboxes/runtime.py`, for `sandboxes`) names
each one and says what lets go of it, so that a new one is not forgotten at shutdown or between
tests. Nothing is imported: the files are read.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SINGLETON = re.compile(r"^(_?[a-z][a-z_]*) = [A-Z]\w*\(", re.M)


def singletons(package: str) -> list[tuple[str, str]]:
    """Return (module, name) of each module singleton of a package but its runtime's."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = path.relative_to(ROOT / package).with_suffix("").as_posix()
        if "migrations" in path.parts or module == "runtime":
            continue
        found += [(module, name) for name in SINGLETON.findall(path.read_text())]
    return found


def test_each_singleton_is_named_by_its_packages_runtime():
    unnamed = []
    for package in ("craft", "sandboxes"):
        runtime = (ROOT / package / "runtime.py").read_text()
        for module, name in singletons(package):
            # Named with the module it sits in, wherever that module has moved.
            if not re.search(rf"`([\w/]+\.)?{re.escape(name)}`", runtime):
                unnamed.append(f"{package}/{module}.py: {name}")
    assert unnamed == []


def test_the_check_finds_the_singletons():
    assert ("storage/eventlog/group_commit", "writer") in singletons("craft")
    assert ("turns/registry", "runners") in singletons("craft")
    assert ("backends/local", "_spawner") in singletons("sandboxes")
    assert len(singletons("craft")) + len(singletons("sandboxes")) >= 25
