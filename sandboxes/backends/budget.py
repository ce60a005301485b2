"""A budget per sandbox: memory, CPU and processes, held by the kernel's cgroups.

With sandbox users on, every local sandbox gets a cgroup, and each of its agents (and Craft's
workspace tool) a leaf below it:

    <hierarchy>/craft-sandboxes-<CRAFT_SANDBOX_UID_BASE>/   the installation (one per uid range,
        <sandbox id>/                                      like the network rule's table)
            agent-<random>/                                one agent start
            tool/                                          the workspace tool's runs

* **The sandbox's cgroup holds its limits**: `CRAFT_SANDBOX_MEMORY` (its memory and swap
  together), `CRAFT_SANDBOX_CPU` (cores, as a CFS quota) and `CRAFT_SANDBOX_PIDS` (processes
  and threads). Whatever its agents start counts against them, however it forked.
* **A leaf per agent start** tells which agent the kernel's OOM killer hit (its `oom_kill`
  count), and holds at most half of the sandbox's processes: a fork bomb in one session
  leaves the other half to the sandbox's other sessions and to Craft's tool. The pids
  controller counts a cgroup's processes, zombies included until they are reaped, so a
  runaway session holds only its own leaf, and that leaf goes with its agent (RLIMIT_NPROC,
  used where there is no cgroup, counts every process of the uid, on the whole machine).
* **A process enters its leaf before it runs anything**: the agent's argv is prefixed with a
  tiny `/bin/sh -c`, run as the server's user, that writes its own pid into the leaf's
  `cgroup.procs` files and then `exec`s the rest (the jail). Nothing it forks can be left
  outside, and a write that fails ends the start (fail closed).
* **Killed as one**: on cgroup v2 by `cgroup.kill`; on v1 by freezing the cgroup, killing
  every process in it (none can fork meanwhile) and thawing it. Then the cgroups are removed.

cgroup v2 (one hierarchy, `cgroup.subtree_control`) is used where it offers the memory, cpu
and pids controllers; else the v1 hierarchies of memory, cpu, pids and freezer. Where neither
is there or writable, `detect` says why, and the local backend refuses to start sandboxes
(`CRAFT_SANDBOX_LIMITS=off` runs them without a budget).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from uuid import UUID

from .base import SandboxError

logger = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer")
V2_CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000
# A leaf's share of its sandbox's processes: one runaway agent leaves the rest to the others.
LEAF_PIDS_SHARE = 2
TOOL_LEAF = "tool"
NETWORK_LEAF = "network"
# v1 shows "no limit" as the largest page-aligned value; anything this big means none.
V1_UNLIMITED = 1 << 62
# How long a kill waits for the kernel to freeze, or to empty, a cgroup.
KILL_SECONDS = 10.0
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use at once; 0 means no limit."""

    memory: int  # bytes, memory and swap together
    cpu: float  # cores
    pids: int  # processes and threads

    def leaf_pids(self) -> int:
        return max(1, self.pids // LEAF_PIDS_SHARE) if self.pids else 0


def format_size(size: int) -> str:
    """Return a size in bytes for people: 4 GiB, 512 MiB, 1.5 GiB, 300 bytes."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            text = f"{value:.1f}".removesuffix(".0")
            return f"{text} {unit}"
    return f"{size} bytes"


class Hierarchy(Protocol):
    """The cgroups of one version, addressed by paths relative to the hierarchy's root."""

    def describe(self) -> str:
        """Return where the cgroups are, for logs and messages."""

    def make(self, relative: str) -> None:
        """Create the cgroup (and those above it); an existing one is fine."""

    def check(self, relative: str) -> None:
        """Raise SandboxError if the cgroup lacks what placing and killing need."""

    def limit(self, relative: str, limits: Limits) -> None:
        """Apply `limits` to the cgroup (writing only what changed)."""

    def limit_pids(self, relative: str, pids: int) -> None:
        """Limit the cgroup's processes and threads (0: no limit of its own)."""

    def procs_files(self, relative: str) -> list[Path]:
        """Return the files a process writes its pid into to enter the cgroup."""

    def oom_kills(self, relative: str) -> int:
        """Return how many processes of the cgroup the OOM killer killed."""

    def peak_memory(self, relative: str) -> int | None:
        """Return the most memory the cgroup used at once, if the kernel tells."""

    def children(self, relative: str) -> list[str]:
        """Return the names of the cgroups right below (none if it does not exist)."""

    def kill(self, relative: str) -> None:
        """Kill every process in the cgroup and below, as one; wait until they are gone."""

    def remove(self, relative: str) -> None:
        """Remove the cgroup and those below it (empty ones; gone is fine)."""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _read(path: Path) -> str:
    with open(path) as handle:
        return handle.read()


def _keyed(path: Path, key: str) -> int:
    """Return the number after `key` in a flat keyed file (memory.events, oom_control)."""
    try:
        text = _read(path)
    except FileNotFoundError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _pids_in(folder: Path) -> set[int]:
    """Return the pids of every process in the cgroup at `folder` and below."""
    found: set[int] = set()
    for parent, _, _ in os.walk(folder):
        with contextlib.suppress(FileNotFoundError):
            found.update(int(pid) for pid in _read(Path(parent) / "cgroup.procs").split())
    return found


def _remove_tree(folder: Path, deadline: float) -> None:
    """rmdir the cgroup at `folder` and those below, deepest first; a cgroup whose last
    process is still exiting is busy for a moment."""
    if not folder.is_dir():
        return
    for parent, _, _ in sorted(os.walk(folder), key=lambda entry: -len(entry[0])):
        while True:
            try:
                os.rmdir(parent)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    why = f"cannot remove the cgroup {parent}: {exc.strerror}"
                    raise SandboxError(why) from exc
                time.sleep(0.01)


class V2:
    """The unified hierarchy (cgroup v2), mounted at `root`.

    Limits are written only for the controllers the hierarchy offers; `detect` uses it only
    where it offers memory, cpu and pids, so that is everywhere it limits. (Elsewhere, as in a
    hybrid layout's controller-less `unified` mount, it still places and kills processes.)
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.controllers = set(_read(root / "cgroup.controllers").split())

    def describe(self) -> str:
        return f"cgroup v2 at {self.root}"

    def make(self, relative: str) -> None:
        folder = self.root
        for part in Path(relative).parts:
            # Each level hands the controllers on to the next: a cgroup may limit only what
            # its parent enabled for its children.
            self._enable_below(folder)
            folder = folder / part
            with contextlib.suppress(FileExistsError):
                folder.mkdir()

    def check(self, relative: str) -> None:
        if not (self.root / relative / "cgroup.kill").exists():
            raise SandboxError(f"{self.describe()} has no cgroup.kill (Linux 5.14 or later has)")

    def _enable_below(self, folder: Path) -> None:
        wanted = [name for name in V2_CONTROLLERS if name in self.controllers]
        if not wanted:
            return
        enabled = set(_read(folder / "cgroup.subtree_control").split())
        missing = [name for name in wanted if name not in enabled]
        if missing:
            _write(folder / "cgroup.subtree_control", " ".join(f"+{name}" for name in missing))

    def limit(self, relative: str, limits: Limits) -> None:
        folder = self.root / relative
        if "memory" in self.controllers:
            memory = str(limits.memory) if limits.memory else "max"
            self._set(folder / "memory.max", memory)
            if (folder / "memory.swap.max").exists():
                # Swap would let a sandbox hold more than its memory: none beyond it.
                self._set(folder / "memory.swap.max", "0" if limits.memory else "max")
        if "cpu" in self.controllers:
            quota = str(round(limits.cpu * CFS_PERIOD_US)) if limits.cpu else "max"
            self._set(folder / "cpu.max", f"{quota} {CFS_PERIOD_US}")
        self.limit_pids(relative, limits.pids)

    def limit_pids(self, relative: str, pids: int) -> None:
        if "pids" in self.controllers:
            self._set(self.root / relative / "pids.max", str(pids) if pids else "max")

    @staticmethod
    def _set(path: Path, value: str) -> None:
        if _read(path).strip() != value:
            _write(path, value)

    def procs_files(self, relative: str) -> list[Path]:
        return [self.root / relative / "cgroup.procs"]

    def oom_kills(self, relative: str) -> int:
        return _keyed(self.root / relative / "memory.events", "oom_kill")

    def peak_memory(self, relative: str) -> int | None:
        try:
            return int(_read(self.root / relative / "memory.peak"))
        except (OSError, ValueError):
            return None

    def children(self, relative: str) -> list[str]:
        try:
            return [entry.name for entry in os.scandir(self.root / relative) if entry.is_dir()]
        except FileNotFoundError:
            return []

    def kill(self, relative: str) -> None:
        folder = self.root / relative
        try:
            _write(folder / "cgroup.kill", "1")
        except FileNotFoundError:
            return  # no such cgroup: nothing runs there
        deadline = time.monotonic() + KILL_SECONDS
        while _keyed(folder / "cgroup.events", "populated"):
            if time.monotonic() > deadline:
                raise SandboxError(f"processes of the cgroup {folder} outlived cgroup.kill")
            time.sleep(0.005)

    def remove(self, relative: str) -> None:
        _remove_tree(self.root / relative, time.monotonic() + KILL_SECONDS)


class V1:
    """The v1 hierarchies of the memory, cpu, pids and freezer controllers (`mounts` maps
    each to where it is mounted; co-mounted ones share a folder)."""

    def __init__(self, mounts: dict[str, Path]) -> None:
        self.mounts = mounts
        self.folders = list(dict.fromkeys(mounts.values()))

    def describe(self) -> str:
        return "cgroup v1 at " + ", ".join(str(folder) for folder in self.folders)

    def make(self, relative: str) -> None:
        for folder in self.folders:
            (folder / relative).mkdir(parents=True, exist_ok=True)

    def check(self, relative: str) -> None:
        if not (self.mounts["freezer"] / relative / "freezer.state").exists():
            raise SandboxError(f"{self.describe()}: the freezer cgroup has no freezer.state")

    def limit(self, relative: str, limits: Limits) -> None:
        memory = self.mounts["memory"] / relative
        # The kernel keeps whole pages: compare with what it would keep.
        wanted = limits.memory - limits.memory % PAGE if limits.memory else -1
        current = int(_read(memory / "memory.limit_in_bytes"))
        if current != wanted and not (wanted == -1 and current >= V1_UNLIMITED):
            swap = memory / "memory.memsw.limit_in_bytes"
            # memory+swap may never be below memory alone: lift it, set memory, lower it to
            # memory (so swap adds nothing to the budget).
            if swap.exists():
                _write(swap, "-1")
            _write(memory / "memory.limit_in_bytes", str(wanted))
            if swap.exists():
                _write(swap, str(wanted))
        cpu = self.mounts["cpu"] / relative
        period = int(_read(cpu / "cpu.cfs_period_us"))
        quota = round(limits.cpu * period) if limits.cpu else -1
        if int(_read(cpu / "cpu.cfs_quota_us")) != quota:
            _write(cpu / "cpu.cfs_quota_us", str(quota))
        self.limit_pids(relative, limits.pids)

    def limit_pids(self, relative: str, pids: int) -> None:
        path = self.mounts["pids"] / relative / "pids.max"
        value = str(pids) if pids else "max"
        if _read(path).strip() != value:
            _write(path, value)

    def procs_files(self, relative: str) -> list[Path]:
        return [folder / relative / "cgroup.procs" for folder in self.folders]

    def oom_kills(self, relative: str) -> int:
        # v1 counts a kill in the cgroup of the process killed, not in those above it.
        return _keyed(self.mounts["memory"] / relative / "memory.oom_control", "oom_kill")

    def peak_memory(self, relative: str) -> int | None:
        try:
            return int(_read(self.mounts["memory"] / relative / "memory.max_usage_in_bytes"))
        except (OSError, ValueError):
            return None

    def children(self, relative: str) -> list[str]:
        try:
            entries = os.scandir(self.mounts["freezer"] / relative)
            return [entry.name for entry in entries if entry.is_dir()]
        except FileNotFoundError:
            return []

    def kill(self, relative: str) -> None:
        """Freeze the cgroup (no process in it can fork any more), SIGKILL every process in
        it, thaw it, and wait until they are gone."""
        freezer = self.mounts["freezer"] / relative
        state = freezer / "freezer.state"
        try:
            _write(state, "FROZEN")
        except FileNotFoundError:
            return
        deadline = time.monotonic() + KILL_SECONDS
        while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.002)  # FREEZING: some tasks are still on their way to the freezer
        try:
            # Every hierarchy: a process is in all of them, unless it was being placed.
            for pid in set().union(*(_pids_in(folder / relative) for folder in self.folders)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            _write(state, "THAWED")  # a frozen process dies only once it is thawed
        while any(_pids_in(folder / relative) for folder in self.folders):
            if time.monotonic() > deadline:
                raise SandboxError(f"processes of the cgroup {freezer} outlived SIGKILL")
            time.sleep(0.005)

    def remove(self, relative: str) -> None:
        deadline = time.monotonic() + KILL_SECONDS
        for folder in self.folders:
            _remove_tree(folder / relative, deadline)


def cgroup_mounts() -> tuple[Path | None, dict[str, Path]]:
    """Return where the cgroup v2 hierarchy is mounted (if it is), and each v1 controller's
    mount point (from MOUNTINFO)."""
    unified: Path | None = None
    v1: dict[str, Path] = {}
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        fields, _, tail = line.partition(" - ")
        parts, details = fields.split(), tail.split()
        if len(parts) < 5 or len(details) < 3:
            continue
        # Mount points escape spaces and the like as octal (\040): decode them.
        point = Path(parts[4].encode().decode("unicode_escape"))
        if details[0] == "cgroup2" and unified is None:
            unified = point
        elif details[0] == "cgroup":
            for option in details[2].split(","):
                if option in V1_CONTROLLERS:
                    v1.setdefault(option, point)
    return unified, v1


def detect() -> Hierarchy:
    """Return the hierarchy sandboxes' budgets live in; raise SandboxError saying why none."""
    unified, v1 = cgroup_mounts()
    if unified is not None:
        try:
            v2 = V2(unified)
        except OSError:
            v2 = None
        if v2 is not None and all(name in v2.controllers for name in V2_CONTROLLERS):
            return v2
    missing = [name for name in V1_CONTROLLERS if name not in v1]
    if not missing:
        return V1(v1)
    if unified is None and not v1:
        raise SandboxError("no cgroup hierarchy is mounted (/sys/fs/cgroup)")
    raise SandboxError(
        "the cgroups here lack the controllers a budget needs: cgroup v2 with memory, cpu "
        f"and pids, or cgroup v1 with {', '.join(V1_CONTROLLERS)} (missing: {', '.join(missing)})"
    )


def installation_name(first_uid: int) -> str:
    """Name the installation's cgroup after its uid range, as the network rule's table is."""
    return f"craft-sandboxes-{first_uid}"


class Leaf:
    """The cgroup of one agent start (or of Craft's tool runs) in a sandbox's budget."""

    def __init__(self, budget: Budget, sandbox_id: UUID, name: str) -> None:
        self.budget = budget
        self.relative = f"{budget.installation}/{sandbox_id}/{name}"

    def command(self, argv: list[str]) -> list[str]:
        """Return `argv` behind the prefix that enters this cgroup before running it."""
        files = self.budget.hierarchy.procs_files(self.relative)
        writes = " && ".join(f"echo $$ > {shlex.quote(str(path))}" for path in files)
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "craft-cgroup", *argv]

    def oom_kills(self) -> int:
        """Return how many of its processes the kernel killed for want of memory."""
        try:
            return self.budget.hierarchy.oom_kills(self.relative)
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        """Kill whatever still runs in it, and remove it."""
        hierarchy = self.budget.hierarchy
        try:
            hierarchy.kill(self.relative)
            hierarchy.remove(self.relative)
        except (OSError, SandboxError) as exc:
            logger.warning("could not clean the cgroup %s up: %s", self.relative, exc)


class Budget:
    """The cgroups of one installation's sandboxes (see the module docstring)."""

    def __init__(self, hierarchy: Hierarchy, first_uid: int, limits: Limits) -> None:
        """Make the installation's cgroup; raise SandboxError saying why it cannot be."""
        self.hierarchy = hierarchy
        self.installation = installation_name(first_uid)
        self.limits = limits
        try:
            hierarchy.make(self.installation)
        except OSError as exc:
            raise SandboxError(
                f"cannot create the sandboxes' cgroup in {hierarchy.describe()}: {exc.strerror}"
            ) from exc
        hierarchy.check(self.installation)

    def describe(self) -> str:
        return f"{self.hierarchy.describe()}, {self.installation}"

    def _sandbox(self, sandbox_id: UUID) -> str:
        relative = f"{self.installation}/{UUID(str(sandbox_id))}"
        self.hierarchy.make(relative)
        # Written at every start, so that changed settings reach sandboxes made before.
        self.hierarchy.limit(relative, self.limits)
        return relative

    def agent_leaf(self, sandbox_id: UUID) -> Leaf:
        """Create a leaf for one agent start in the sandbox's budget."""
        return self._leaf(sandbox_id, f"agent-{secrets.token_hex(6)}")

    def network_leaf(self, sandbox_id: UUID) -> Leaf:
        """Return the leaf of the sandbox's network (its pasta: the CPU and memory it spends
        on the sandbox's traffic are the sandbox's)."""
        return self._leaf(sandbox_id, NETWORK_LEAF)

    def tool_leaf(self, sandbox_id: UUID) -> Leaf:
        """Return the leaf of Craft's runs of the workspace tool in the sandbox (made once)."""
        return self._leaf(sandbox_id, TOOL_LEAF)

    def _leaf(self, sandbox_id: UUID, name: str) -> Leaf:
        try:
            relative = f"{self._sandbox(sandbox_id)}/{name}"
            self.hierarchy.make(relative)
            self.hierarchy.limit_pids(relative, self.limits.leaf_pids())
        except OSError as exc:
            raise SandboxError(f"cannot set up the sandbox's cgroup: {exc}") from exc
        return Leaf(self, sandbox_id, name)

    def peak_memory(self, sandbox_id: UUID) -> int | None:
        """Return the most memory the sandbox used at once (what the kernel recorded)."""
        return self.hierarchy.peak_memory(f"{self.installation}/{sandbox_id}")

    def kill_sandbox(self, sandbox_id: UUID) -> None:
        """Kill every process of the sandbox as one, and remove its cgroups; raise
        SandboxError when some outlive it."""
        relative = f"{self.installation}/{UUID(str(sandbox_id))}"
        try:
            self.hierarchy.kill(relative)
            self.hierarchy.remove(relative)
        except OSError as exc:
            raise SandboxError(f"cannot kill the sandbox's cgroup: {exc.strerror}") from exc

    def sandboxes(self) -> list[UUID]:
        """Return the ids of the sandboxes that have a cgroup here."""
        found = []
        for name in self.hierarchy.children(self.installation):
            with contextlib.suppress(ValueError):
                found.append(UUID(name))
        return found


def remove(first_uid: int) -> None:
    """Kill every process of the installation's sandboxes and remove its cgroups (tests; an
    operator turning budgets off); none there is fine."""
    try:
        hierarchy = detect()
    except SandboxError:
        return
    relative = installation_name(first_uid)
    hierarchy.kill(relative)
    hierarchy.remove(relative)
