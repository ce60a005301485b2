"""Helpers for tests of the kubernetes backend (fixtures `kube`, `kube_backend`: conftest)."""

from __future__ import annotations

import sys
from pathlib import Path

from sandboxes.backends import containment

from ..conftest import K8S_NAMESPACE as NAMESPACE

__all__ = ["NAMESPACE", "agent_execs", "image_git_tool", "image_workspace_tool"]

# Where the sandbox image (deploy/sandbox-image/Dockerfile) has Craft's tools, compiled.
IMAGE_TOOLS = Path("/opt/craft")


def agent_execs(kube) -> list:
    """Return the exec records of agent processes (not workspace commands)."""
    return [e for e in kube.execs if "sandboxes.in_sandbox.demo_agent" in e.argv]


def image_workspace_tool(folder: Path) -> list[str]:
    """Lay the workspace tool out in `folder` as the sandbox image has it in /opt/craft (the
    source and its bytecode), and return the CRAFT_K8S_WORKSPACE_TOOL default for that folder
    and this python: the test API server's pods run the same form a real pod does."""
    containment.install_workspace_tool(folder, sys.executable)
    return containment.module_command(sys.executable, folder, "workspace_tool")


def image_git_tool(folder: Path) -> list[str]:
    """Lay Craft's git tool out in `folder` as the sandbox image has it, and return the
    CRAFT_K8S_GIT_TOOL default for that folder and this python."""
    containment.install_git_tool(folder, sys.executable)
    return containment.module_command(sys.executable, folder, "git_tool")
