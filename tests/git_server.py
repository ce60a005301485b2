"""A real git host for tests: `git http-backend` behind a small HTTP server with token auth.

Git's own smart-HTTP backend (the CGI program Debian's `git` ships) serves clone, fetch and
push of bare repositories under a folder; this server in front of it, on 127.0.0.1 and a
port of its own, adds what a git host does about access:

* each repository is public (anyone reads) or private; `readers` and `writers` are the
  tokens that may read, and read and push (Basic auth, any user name, the token as password,
  as GitHub, GitLab and Gitea take one). A request without a token that would need one gets
  401 and a Basic challenge, a wrong token 401, a reader's push 403, a missing repository 404.
* it records every request (method, path, the Authorization header it carried) so that a
  test can say which tokens reached it; `refuse_pushes` refuses every push (403),
  `stall_seconds` holds each request that much before answering (a slow or hung host).

Use it as a context manager or through the `git_server` fixture (`tests.sandboxes` and any
test that imports it: `from tests.git_server import git_server`); daphne tests reach it at
`server.url`. Repositories are made with `create` and read back with `read`, `branches`
and `log`; `commit` adds a commit on the host's side (someone else's push).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
# git with nothing of this machine's configuration, for the host's own work.
GIT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Hosted Person",
    "GIT_AUTHOR_EMAIL": "hosted@example.com",
    "GIT_COMMITTER_NAME": "Hosted Person",
    "GIT_COMMITTER_EMAIL": "hosted@example.com",
    "LC_ALL": "C",
}


@dataclass
class Access:
    public: bool = False
    readers: set[str] = field(default_factory=set)
    writers: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Seen:
    """One request the host received."""

    method: str
    path: str  # with its query
    authorization: str | None

    @property
    def token(self) -> str | None:
        """The password of its Basic credentials, if it carried any."""
        if not self.authorization or not self.authorization.startswith("Basic "):
            return None
        decoded = base64.b64decode(self.authorization[6:]).decode(errors="replace")
        return decoded.partition(":")[2]


def git(*args: str, cwd: Path | str | None = None, input: bytes | None = None) -> str:
    """Run git as the host does (none of this machine's configuration); return stdout."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, input=input, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode(errors="replace").strip()


class GitServer:
    """Bare repositories under `root`, served over smart HTTP on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.access: dict[str, Access] = {}
        self.seen: list[Seen] = []
        self.refuse_pushes = False
        self.stall_seconds = 0.0
        self.stall_match = ""
        self.stalled = threading.Event()  # set when a request is being held
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GitServer:
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stall_seconds = 0.0
        self._http.shutdown()
        self._http.server_close()

    # --- repositories -------------------------------------------------------------------

    def create(
        self,
        name: str,
        files: dict[str, bytes] | None = None,
        *,
        branches: dict[str, dict[str, bytes]] | None = None,
        default: str = "main",
        public: bool = False,
        readers: tuple[str, ...] = (),
        writers: tuple[str, ...] = (),
    ) -> str:
        """Create repository `name` ("owner/repo.git") with `files` on `default`, and each of
        `branches` as `default` plus its files; return its URL."""
        bare = self.root / name
        git("init", "--quiet", "--bare", f"--initial-branch={default}", str(bare))
        git("config", "http.receivepack", "true", cwd=bare)
        self.access[name] = Access(public, set(readers) | set(writers), set(writers))
        self.commit(name, default, files or {"README.md": b"# hello\n"}, "First commit")
        for branch, more in (branches or {}).items():
            git("branch", branch, default, cwd=bare)
            self.commit(name, branch, more, f"Work on {branch}")
        return f"{self.url}/{name}"

    def commit(self, name: str, branch: str, files: dict[str, bytes], message: str) -> str:
        """Commit `files` on `branch` of the hosted repository (someone else's push)."""
        bare = self.root / name
        with tempfile.TemporaryDirectory() as work:
            index = {**GIT_ENV, "GIT_INDEX_FILE": f"{work}/index", "GIT_DIR": str(bare)}
            parent = subprocess.run(
                ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
                env=index, capture_output=True, check=False,
            ).stdout.decode().strip()  # fmt: skip
            if parent:
                subprocess.run(["git", "read-tree", parent], env=index, check=True)
            for path, content in files.items():
                blob = subprocess.run(
                    ["git", "hash-object", "-w", "--stdin"], env=index, input=content,
                    capture_output=True, check=True,
                ).stdout.decode().strip()  # fmt: skip
                subprocess.run(
                    ["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}"],
                    env=index, check=True,
                )  # fmt: skip
            tree = (
                subprocess.run(["git", "write-tree"], env=index, capture_output=True, check=True)
                .stdout.decode()
                .strip()
            )
            parents = ["-p", parent] if parent else []
            commit = subprocess.run(
                ["git", "commit-tree", tree, *parents, "-m", message],
                env=index, capture_output=True, check=True,
            ).stdout.decode().strip()  # fmt: skip
            git("update-ref", f"refs/heads/{branch}", commit, cwd=bare)
        return commit

    def read(self, name: str, branch: str, path: str) -> bytes:
        bare = self.root / name
        return subprocess.run(
            ["git", "show", f"refs/heads/{branch}:{path}"], cwd=bare, env=GIT_ENV,
            capture_output=True, check=True,
        ).stdout  # fmt: skip

    def branches(self, name: str) -> dict[str, str]:
        """Return the hosted repository's branches and their commits."""
        out = git("for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads",
                  cwd=self.root / name)  # fmt: skip
        return dict(line.split() for line in out.splitlines())

    def log(self, name: str, branch: str, format: str = "%H %an <%ae> %s") -> list[str]:
        return git("log", f"--format={format}", f"refs/heads/{branch}",
                   cwd=self.root / name).splitlines()  # fmt: skip

    def tokens_seen(self) -> set[str]:
        return {seen.token for seen in self.seen if seen.token}


def _handler(server: GitServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: object) -> None:
            pass  # recorded in `server.seen`

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            authorization = self.headers.get("Authorization")
            server.seen.append(Seen(self.command, self.path, authorization))
            if server.stall_seconds and server.stall_match in self.path:
                server.stalled.set()
                deadline = time.monotonic() + server.stall_seconds
                while server.stall_seconds and time.monotonic() < deadline:
                    time.sleep(0.05)
            parts = urlsplit(self.path)
            name = _repository_of(parts.path, server.access)
            if name is None:
                return self._plain(404, "Repository not found")
            access = server.access[name]
            push = "git-receive-pack" in parts.path or "service=git-receive-pack" in parts.query
            token = Seen(self.command, self.path, authorization).token
            if token is None and (push or not access.public):
                return self._plain(401, "Authentication required", challenge=True)
            if token is not None and token not in access.readers and not access.public:
                return self._plain(401, "Bad credentials", challenge=True)
            if push and (token not in access.writers or server.refuse_pushes):
                return self._plain(403, "Pushes refused")
            self._cgi(parts.path, parts.query)

        def _plain(self, status: int, text: str, challenge: bool = False) -> None:
            body = text.encode() + b"\n"
            self.send_response(status)
            if challenge:
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _cgi(self, path: str, query: str) -> None:
            env = {
                **GIT_ENV,
                "GIT_PROJECT_ROOT": str(server.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "REMOTE_USER": "someone",
                "REMOTE_ADDR": "127.0.0.1",
            }
            if encoding := self.headers.get("Content-Encoding"):
                env["HTTP_CONTENT_ENCODING"] = encoding
            if protocol := self.headers.get("Git-Protocol"):
                env["GIT_PROTOCOL"] = protocol
            body = self._body() if self.command == "POST" else b""
            env["CONTENT_LENGTH"] = str(len(body))
            done = subprocess.run([HTTP_BACKEND], env=env, input=body, capture_output=True)
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            if not _:
                head, _, payload = done.stdout.partition(b"\n\n")
            status = 200
            headers = []
            for line in head.decode(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.lower() == "status":
                    status = int(value.split()[0])
                elif key:
                    headers.append((key, value.strip()))
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def _repository_of(path: str, repositories: dict[str, Access]) -> str | None:
    for name in repositories:
        if path == f"/{name}" or path.startswith(f"/{name}/"):
            return name
    return None


@pytest.fixture
def git_server() -> Iterator[GitServer]:
    """A git host on 127.0.0.1 for this test, its repositories in a folder of its own."""
    root = Path(tempfile.mkdtemp(prefix="craft-git-host-"))
    try:
        with GitServer(root) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


def random_bytes(size: int) -> bytes:
    """Content git cannot compress (for repositories over a size limit)."""
    return os.urandom(size)
