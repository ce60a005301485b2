"""Serve Craft as several daphne workers behind HAProxy, on PostgreSQL and Redis, on one machine.

`make run-cluster` runs this. It is the several-workers deployment in small, so that a person
can try what happens when a worker dies or restarts: HAProxy spreads connections over the
workers round-robin (no stickiness), each session's agent runs in the worker that holds its
lease, frames reaching another worker are forwarded to it through Redis, and when a worker
dies another takes its sessions over (docs/deployment.md).

    python deploy/cluster/run.py [--workers 3] [--port 8000] [--worker-ports 8001,8002,...]

Environment: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/craft, created if
missing), REDIS_URL (default redis://127.0.0.1:6379/1), CRAFT_VAR_DIR (default var/cluster:
the workers share its sandbox folders). A worker that dies is started again, as a process
manager would. Ctrl-C stops everything: the workers shut down cleanly (SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent.parent
DAPHNE_OPTIONS = [
    "--websocket-max-message-size",
    "4194304",
    "--websocket-max-frame-size",
    "4194304",
]

HAPROXY = """\
global
    # Two file descriptors a connection: within the usual limit of open files.
    maxconn 4000

defaults
    mode http
    option http-server-close
    # A worker that just died refuses or drops the connection: try another one.
    retries 3
    option redispatch
    retry-on conn-failure empty-response
    http-reuse never
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h

frontend craft
    bind 127.0.0.1:{port}
    default_backend workers

backend workers
    balance roundrobin
    option httpchk
    http-check send meth GET uri /readyz hdr Host 127.0.0.1
{servers}
"""


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database named by `url` if it does not exist."""
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def wait_until_up(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.1)


class Cluster:
    """HAProxy and the workers; a worker that dies is started again."""

    def __init__(self, env: dict[str, str], var: Path, port: int, worker_ports: list[int]) -> None:
        self.env = env
        self.var = var
        self.port = port
        self.ports = worker_ports
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.proxy: subprocess.Popen[bytes] | None = None

    def start_worker(self, port: int) -> None:
        worker = subprocess.Popen(
            [sys.executable, "-m", "daphne", *DAPHNE_OPTIONS, "-b", "127.0.0.1", "-p", str(port),
             "craft.asgi:application"],
            env=self.env, cwd=ROOT,
        )  # fmt: skip
        self.workers[port] = worker
        wait_until_up(f"http://127.0.0.1:{port}/healthz", worker, f"worker on port {port}")
        print(f"worker pid {worker.pid} on port {port}", flush=True)

    def serve(self) -> None:
        for port in self.ports:
            self.start_worker(port)
        servers = "\n".join(
            f"    server worker{i + 1} 127.0.0.1:{port} check inter 2s"
            for i, port in enumerate(self.ports)
        )
        config = self.var / "haproxy.cfg"
        config.write_text(HAPROXY.format(port=self.port, servers=servers))
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.proxy = subprocess.Popen([haproxy, "-db", "-f", str(config)], env=self.env)
        wait_until_up(f"http://127.0.0.1:{self.port}/healthz", self.proxy, "HAProxy")
        print(
            f"Serving Craft on http://127.0.0.1:{self.port}/ through HAProxy, "
            f"{len(self.ports)} workers (try: kill -KILL <a worker pid>)",
            flush=True,
        )
        # Like a process manager: a worker that dies is started again (its sessions have
        # moved to the others meanwhile, or wait for their leases to expire).
        while self.proxy.poll() is None:
            time.sleep(0.5)
            for port, worker in list(self.workers.items()):
                if worker.poll() is not None:
                    print(f"worker pid {worker.pid} exited ({worker.returncode}); restarting it",
                          flush=True)  # fmt: skip
                    self.start_worker(port)

    def stop(self) -> None:
        """Stop the proxy, then the workers cleanly (SIGTERM: they finish or record turns)."""
        processes = [p for p in [self.proxy, *self.workers.values()] if p is not None]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--worker-ports",
        help="comma-separated ports of the workers (default: the ports after --port)",
    )
    args = parser.parse_args()
    if args.worker_ports:
        worker_ports = [int(port) for port in args.worker_ports.split(",")]
    else:
        worker_ports = [args.port + 1 + i for i in range(args.workers)]
    var = Path(os.environ.get("CRAFT_VAR_DIR", ROOT / "var" / "cluster")).resolve()
    env = {
        **os.environ,
        "DJANGO_DEBUG": os.environ.get("DJANGO_DEBUG", "1"),
        "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/craft"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/1"),
        "CRAFT_VAR_DIR": str(var),
    }
    var.mkdir(parents=True, exist_ok=True)
    ensure_database(env["DATABASE_URL"])
    for command in (["migrate", "--noinput"], ["collectstatic", "--noinput", "-v", "0"],
                    ["ensure_admin"]):  # fmt: skip
        subprocess.run([sys.executable, "manage.py", *command], env=env, cwd=ROOT, check=True)
    cluster = Cluster(env, var, args.port, worker_ports)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        cluster.serve()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()  # whatever happened, no worker is left behind


if __name__ == "__main__":
    main()
