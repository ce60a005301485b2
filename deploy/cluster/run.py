"""Serve Craft as several daphne workers behind HAProxy, on PostgreSQL and Redis, on one machine.

`make run-cluster` runs this. It is the several-workers deployment in small, so that a person
can try what happens when a worker dies or restarts: HAProxy spreads connections over the
workers round-robin (no stickiness), each session's agent runs in the worker that holds its
lease, frames reaching another worker are forwarded to it through Redis, and when a worker
dies another takes its sessions over (docs/deployment.md).

    python deploy/cluster/run.py [--workers 3] [--port 8000] [--worker-ports 8001,8002,...]

Environment: DATABASE_URL and REDIS_URL (default: a PostgreSQL and a Redis of the cluster's
own, started here on free loopback ports, each asking for a password kept in CRAFT_VAR_DIR,
as they must where agents run on the same machine), CRAFT_VAR_DIR (default var/cluster: the
workers share its sandbox folders). A worker that dies is started again, as a process manager
would. Ctrl-C stops everything: the workers shut down cleanly (SIGTERM), then the services.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlparse

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def password_in(path: Path) -> str:
    """Return the password kept in `path` (0600), made up the first time."""
    if not path.exists():
        path.write_text(secrets.token_urlsafe(24) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


@contextlib.contextmanager
def private_redis(var: Path) -> Iterator[str]:
    """Run a Redis of the cluster's own that asks for a password; yield its URL."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    password = password_in(var / "redis-password")
    port = free_port()
    config = var / "redis.conf"  # not the command line: `ps` shows that to every user
    config.write_text(
        f'port {port}\nbind 127.0.0.1\nrequirepass {password}\nsave ""\nappendonly no\ndir {var}\n'
    )
    config.chmod(0o600)
    process = subprocess.Popen([server, str(config)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the cluster's Redis did not start")
            time.sleep(0.05)
        print(f"Redis on 127.0.0.1:{port} (password in {var / 'redis-password'})", flush=True)
        yield f"redis://:{quote(password)}@127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(30)


@contextlib.contextmanager
def private_postgres(var: Path) -> Iterator[str]:
    """Run a PostgreSQL of the cluster's own that asks for a password; yield its URL.

    PostgreSQL will not run as root: it runs as the `postgres` account, with its data in that
    account's home (a folder it can reach wherever this checkout is).
    """
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not versions:
        raise SystemExit(
            "make run-cluster runs a PostgreSQL of its own: install Debian's postgresql, or "
            "set DATABASE_URL to one (with a password)"
        )
    bin_dir = versions[-1].parent
    account = pwd.getpwnam("postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    # One data folder per cluster folder, kept between runs.
    folder = hashlib.sha256(str(var).encode()).hexdigest()[:16]
    data = Path(account.pw_dir) / "craft-cluster" / folder
    if (data / "PG_VERSION").exists() and not (var / "postgres-password").exists():
        # Its password went with the cluster folder (deleted, or made anew at the same path):
        # nobody can sign in to it any more, and what it held belonged to that folder.
        print(f"Removing the cluster's old PostgreSQL data ({data}): its password is gone",
              flush=True)  # fmt: skip
        shutil.rmtree(data)
    password = password_in(var / "postgres-password")
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chown(data.parent, account.pw_uid, account.pw_gid)
        os.chown(data, account.pw_uid, account.pw_gid)
        pwfile = data.parent / "initial-password"
        pwfile.write_text(password + "\n")
        os.chown(pwfile, account.pw_uid, account.pw_gid)
        pwfile.chmod(0o600)
        subprocess.run(
            [*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "craft",
             f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        pwfile.unlink()
    port = free_port()
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
    pg_ctl = [*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-w"]
    subprocess.run(
        [*pg_ctl, "-o", options, "-l", str(data / "server.log"), "start"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        print(f"PostgreSQL on 127.0.0.1:{port}, data in {data} "
              f"(password in {var / 'postgres-password'})", flush=True)  # fmt: skip
        yield f"postgres://craft:{quote(password)}@127.0.0.1:{port}/craft"
    finally:
        subprocess.run([*pg_ctl, "-m", "fast", "stop"], check=False, stdout=subprocess.DEVNULL)


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
        """Stop the proxy, then the workers cleanly (SIGTERM: they finish or record turns).

        Says how long each took: a stop that takes long is worth knowing about.
        """
        processes = [p for p in [self.proxy, *self.workers.values()] if p is not None]
        started = time.monotonic()
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(max(1.0, started + 60 - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"pid {process.pid} did not stop within 60 s; killing it", flush=True)
                process.kill()
                process.wait()
            took = time.monotonic() - started
            print(f"pid {process.pid} stopped ({process.returncode}) after {took:.1f} s",
                  flush=True)  # fmt: skip


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
    var.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as services:
        database = os.environ.get("DATABASE_URL") or services.enter_context(private_postgres(var))
        redis = os.environ.get("REDIS_URL") or services.enter_context(private_redis(var))
        env = {
            **os.environ,
            "DJANGO_DEBUG": os.environ.get("DJANGO_DEBUG", "1"),
            "DATABASE_URL": database,
            "REDIS_URL": redis,
            "CRAFT_VAR_DIR": str(var),
        }
        run_cluster(env, var, args.port, worker_ports)


def run_cluster(env: dict[str, str], var: Path, port: int, worker_ports: list[int]) -> None:
    ensure_database(env["DATABASE_URL"])
    for command in (["migrate", "--noinput"], ["collectstatic", "--noinput", "-v", "0"],
                    ["ensure_admin"]):  # fmt: skip
        subprocess.run([sys.executable, "manage.py", *command], env=env, cwd=ROOT, check=True)
    cluster = Cluster(env, var, port, worker_ports)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C explicitly too: Python leaves SIGINT ignored when it starts ignored (a job started
    # in the background by a non-interactive shell), and the workers must stop all the same.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        cluster.serve()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()  # whatever happened, no worker is left behind


if __name__ == "__main__":
    main()
