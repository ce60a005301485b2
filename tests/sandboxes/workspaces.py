"""Session workspaces on both backends, as the agent leaves them and as Craft reads them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sandboxes import services
from sandboxes.agent.connections import agent_connections
from sandboxes.backends.kubernetes import pod_name
from sandboxes.workspace import Workspace
from tests.conftest import K8S_NAMESPACE
from tests.ready import open_ready_session

from .hostile import contain, open_agent


class Workspaces:
    """A user's session workspace on disk, and the same workspace as Craft reads it."""

    def __init__(self, user, folder_of=None) -> None:
        if folder_of is None:  # local: the hostile agent, as the sandbox's user
            self.session, _ = open_agent(user)
        else:
            self.session = open_ready_session(user, "workspace")
            services.connect_agent(self.session.sandbox, self.session.pk)
        self.sandbox = self.session.sandbox
        self.backend = "local" if folder_of is None else "kubernetes"
        path = services.workspace_path(self.sandbox, self.session.pk)
        self.folder = Path(path) if folder_of is None else folder_of(self.sandbox, path)
        # The demo agent keeps its state in the workspace: stop it and start from empty.
        agent_connections.stop_session(self.sandbox.pk, self.session.pk)
        shutil.rmtree(self.folder / ".craft-demo-agent", ignore_errors=True)
        stat = self.folder.stat()
        self.uid, self.gid = stat.st_uid, stat.st_gid

    @property
    def craft(self) -> Workspace:
        return services.session_workspace(self.sandbox, self.session.pk)

    def own(self, *paths: Path) -> None:
        for path in paths:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def write(self, name: str | bytes, content: bytes = b"", mode: int = 0o600) -> Path:
        path = Path(os.fsdecode(os.path.join(os.fsencode(self.folder), os.fsencode(name))))
        path.parent.mkdir(parents=True, exist_ok=True)
        self.own(path.parent)
        path.write_bytes(content)
        path.chmod(mode)
        self.own(path)
        return path

    def link(self, name: str, target: str | Path) -> Path:
        path = self.folder / name
        path.symlink_to(target)
        self.own(path)
        return path


def read_all(workspace: Workspace, path: str, limit: int = 1 << 20) -> bytes:
    download = workspace.read(path, limit)
    chunks = []
    while chunk := download.read():
        chunks.append(chunk)
    return b"".join(chunks)


def open_on(backend: str, request, settings, user) -> Workspaces:
    if backend == "local":
        request.getfixturevalue("machine")
        contain(settings, "on")
        return Workspaces(user)
    kube = request.getfixturevalue("kube")
    request.getfixturevalue("kube_backend")

    def folder_of(sandbox, path: str) -> Path:
        return kube.workspace(K8S_NAMESPACE, pod_name(sandbox)) / Path(path).relative_to(
            "/workspace"
        )

    return Workspaces(user, folder_of)
