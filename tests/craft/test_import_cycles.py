"""No module of the product imports itself back, through however many others.

Every module under `craft/` and `sandboxes/` is parsed (nothing is imported) and each of its
imports of another of their modules is an edge of a graph: at module level or inside a
function, `import x` or `from x import y` (a name imported from a package counts as its module
when it is one), and importing `a.b.c` counts as importing the packages `a.b` and `a` too (their
`__init__` runs first), except the packages around the importing module itself: they have run
before it whatever it imports, so a module of `a.b` importing its sibling `a.b.d` does not
import `a.b` back (naming `a.b` itself, as `from a.b import name`, still does). Imports under
`if TYPE_CHECKING:` count as well: they never run, so they make no circle at run time, but a
module that names another's types knows it as surely as one that calls it, and a circle of
them is two modules that cannot be understood, or moved, apart. Any cycle of that graph fails
the test, named module by module.
"""

from __future__ import annotations

from pathlib import Path

from .test_layers import imported_names, module_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("craft", "sandboxes")


def imports_of(path: Path) -> set[str]:
    """Return the product's modules a file imports, with the packages around them."""
    module = module_name(path)
    found: set[str] = set()
    own = module.split(".")
    around = {".".join(own[:end]) for end in range(1, len(own))}  # the packages it is in
    for name, _ in imported_names(path):
        parts = name.split(".")
        if parts[0] in PACKAGES:
            found |= {".".join(parts[:end]) for end in range(1, len(parts))} - around
            found.add(name)
    return found - {module}


def import_graph() -> dict[str, set[str]]:
    paths = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    graph = {module_name(path): imports_of(path) for path in paths}
    return {module: {name for name in names if name in graph} for module, names in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return one cycle of each group of modules that import one another (Tarjan's strongly
    connected components), as the modules in import order, the first one again at the end."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for name in sorted(graph[module]):
            if name not in index:
                visit(name)
                low[module] = min(low[module], low[name])
            elif name in stack:
                low[module] = min(low[module], index[name])
        if low[module] == index[module]:
            group = set()
            while True:
                name = stack.pop()
                group.add(name)
                if name == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [cycle_in(graph, group) for group in groups]


def cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """Return a shortest cycle through the first module of `group` (a breadth-first walk)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for name in sorted(graph[module] & group):
                if name == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if name not in came_from:
                    came_from[name] = module
                    following.append(name)
        frontier = following
    raise AssertionError(f"{sorted(group)} holds no cycle")


def test_no_module_of_the_product_imports_itself_back():
    graph = import_graph()
    found = [" -> ".join(cycle) for cycle in cycles(graph)]
    assert not found, "modules that import themselves back:\n" + "\n".join(found)
    # Not vacuously: both packages were read, with their imports.
    assert len(graph) >= 140
    assert sum(len(names) for names in graph.values()) >= 500


def test_the_check_reads_every_kind_of_import_and_finds_cycles():
    # Inside a function: `CraftConfig.ready` imports `craft.cluster.forwarding`.
    assert "craft.cluster.forwarding" in imports_of(ROOT / "craft" / "apps.py")
    # Under `if TYPE_CHECKING:`: the backends' interface names the workspace's type.
    assert "sandboxes.workspace" in imports_of(ROOT / "sandboxes" / "backends" / "base.py")
    # Importing a module runs its packages: `sandboxes.backends` is imported by that name.
    assert "sandboxes.backends" in imports_of(ROOT / "sandboxes" / "services.py")
    # A module's own packages are not imported back by its imports of its siblings; the
    # package itself, named, is.
    appending = imports_of(ROOT / "craft" / "storage" / "eventlog" / "appending.py")
    assert "craft.storage.eventlog.turn_rows" in appending
    assert "craft.storage.eventlog" not in appending
    assert "craft.storage" in imports_of(ROOT / "craft" / "services.py")
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}) == [["a", "b", "a"]]
