"""A small Kubernetes API server that the official client can talk to, for tests."""

from tests.kubeapi.server import ExecRecord, KubeTestServer

__all__ = ["ExecRecord", "KubeTestServer"]
