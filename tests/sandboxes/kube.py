"""Helpers for tests of the kubernetes backend (fixtures `kube`, `kube_backend`: conftest)."""

from __future__ import annotations

from ..conftest import K8S_NAMESPACE as NAMESPACE

__all__ = ["NAMESPACE", "agent_execs"]


def agent_execs(kube) -> list:
    """Return the exec records of agent processes (not workspace commands)."""
    return [e for e in kube.execs if "sandboxes.demo_agent" in e.argv]
