"""A Kubernetes API server for tests, serving what Craft's kubernetes backend calls.

`server.py` is the server (`KubeTestServer`), `objects.py` its pods, services, events and
network policies, `exec.py` its pod exec websocket.
"""

from tests.kubeapi.exec import ExecRecord
from tests.kubeapi.server import KubeTestServer

__all__ = ["ExecRecord", "KubeTestServer"]
