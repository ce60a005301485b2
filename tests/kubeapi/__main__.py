"""Run the test API server by hand: `python -m tests.kubeapi --port 8001 --root DIR`.

It writes a kubeconfig into DIR, prints its path, and serves until interrupted, e.g.
`KUBECONFIG=DIR/kubeconfig kubectl get pods` or the Python client against it.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from tests.kubeapi.server import KubeTestServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.kubeapi", description=__doc__)
    parser.add_argument("--port", type=int, default=8001, help="port on 127.0.0.1 (0: any)")
    parser.add_argument("--root", type=Path, required=True, help="folder of pod workspaces")
    parser.add_argument("--ready-delay", type=float, default=0.2, help="seconds until Ready")
    args = parser.parse_args(argv)

    server = KubeTestServer(args.root, port=args.port)
    server.ready_delay = args.ready_delay
    stopping = threading.Event()
    # Stop cleanly (killing exec processes) on Ctrl+C and on SIGTERM alike.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    with server:
        kubeconfig = server.write_kubeconfig(args.root / "kubeconfig")
        print(kubeconfig, flush=True)
        print(f"serving on {server.url}; press Ctrl+C to stop", flush=True)
        while not stopping.wait(0.5):
            pass


if __name__ == "__main__":
    main()
