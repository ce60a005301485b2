"""A Kubernetes API server for tests, serving what Craft's kubernetes backend calls.

`server.py` is the server (`KubeTestServer`) and the folders of its volumes, `objects.py` its
pods, services, events, secrets, volume claims and network policies (and their schema
checks), `exec.py` its pod exec websocket.
"""

from tests.kubeapi.exec import ExecRecord
from tests.kubeapi.server import KubeTestServer

__all__ = ["ExecRecord", "KubeTestServer"]
