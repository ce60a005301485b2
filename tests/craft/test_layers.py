"""Imports inside `craft/` only point down the layers docs/architecture.md names.

Every module under `craft/` is parsed (nothing is imported) and each of its imports of another
`craft` module, at module level or inside a function, `import x` or `from x import y`, is held
against the order below: a module may import its own layer and the layers under it, never one
above. What a lower layer must reach above it, it reaches through a callable the top wires in at
start (`CraftConfig.ready`, `craft.lifecycle`).
"""

from __future__ import annotations

import ast
from pathlib import Path

CRAFT = Path(__file__).resolve().parents[2] / "craft"

# Top to bottom; the groups of one layer are independent (neither imports the other). A module
# belongs to the group of its longest matching prefix; `craft` alone catches the rest: the
# entry points (ASGI, apps, URLs, views, the admin, the websocket consumer and its routing,
# start-up, management commands), beside the JSON API and the HTTP plumbing.
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {
        "entry": (
            "craft",
            "craft.api",
            "craft.http",
            "craft.live.consumer",
            "craft.live.status_consumer",
            "craft.live.terminal",
            "craft.live.routing",
        )
    },
    {"services": ("craft.services",)},
    {"cluster": ("craft.cluster",), "turns": ("craft.turns",)},
    {"live": ("craft.live",)},
    {"commands": ("craft.commands",)},
    {"storage": ("craft.storage",)},
    {
        "base": (
            "craft.errors",
            "craft.models",
            "craft.settings",
            "craft.credentials",
            "craft.git_hosts",
            "craft.git_tokens",
            "craft.host_api",
            "craft.toml_files",
        )
    },
)


def place_of(module: str) -> tuple[int, str]:
    """Return the layer (its index in LAYERS, 0 at the top) and the group of a `craft` module."""
    best, best_length = (-1, ""), -1
    for index, groups in enumerate(LAYERS):
        for group, prefixes in groups.items():
            for prefix in prefixes:
                matches = module == prefix or module.startswith(prefix + ".")
                if matches and len(prefix) > best_length:
                    best, best_length = (index, group), len(prefix)
    assert best_length >= 0, f"{module} is in no layer"
    return best


def module_name(path: Path) -> str:
    parts = path.relative_to(CRAFT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = CRAFT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_names(path: Path) -> list[tuple[str, int]]:
    """Return every module a file of the repository imports, at module level or inside a
    function (a name imported from a package counts as its module when it is one), with the
    line of each import."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base
                for alias in node.names
            ]
        else:
            continue
        found += [(name, node.lineno) for name in names]
    return found


def craft_imports(path: Path) -> list[tuple[str, int]]:
    """Return the `craft` modules a file imports, with the line of each import."""
    return [(name, line) for name, line in imported_names(path) if name.split(".")[0] == "craft"]


def points_up(importer: str, imported: str) -> bool:
    """Return whether `importer` may not import `imported`: a layer above, or an independent
    group of its own layer."""
    (layer, group), (their_layer, their_group) = place_of(importer), place_of(imported)
    return their_layer < layer or (their_layer == layer and their_group != group)


def test_no_module_of_craft_imports_a_layer_above_its_own():
    modules = sorted(CRAFT.rglob("*.py"))
    imports = {module_name(path): craft_imports(path) for path in modules}
    upward = [
        f"{module} ({place_of(module)[1]}) imports {name} ({place_of(name)[1]}), line {line}"
        for module, found in imports.items()
        for name, line in found
        if points_up(module, name)
    ]
    assert upward == []
    # Not vacuously: the whole package was read, and every group holds modules that are used.
    assert len(modules) >= 80
    assert sum(len(found) for found in imports.values()) >= 280
    used = {place_of(name) for found in imports.values() for name, _ in found}
    assert used == {(index, group) for index, groups in enumerate(LAYERS) for group in groups}


def test_the_check_reads_imports_inside_functions_and_modules_named_from_packages():
    # `CraftConfig.ready` imports inside a function: `from craft.cluster import forwarding`.
    assert "craft.cluster.forwarding" in {name for name, _ in craft_imports(CRAFT / "apps.py")}
    assert points_up("craft.services", "craft.live.consumer")
    assert not points_up("craft.services", "craft.live.delivery")
    assert points_up("craft.cluster.leases", "craft.turns.recovery")
