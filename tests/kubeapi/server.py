"""A Kubernetes API server for tests, with what Craft's kubernetes backend calls and no more.

The official `kubernetes` Python client talks to it over loopback HTTP exactly as it talks to
a cluster. What it serves, as a real API server answers it:

* pods: create, get, list (by label), delete, and a JSON patch (`test`, `add`, `replace`,
  `remove`) of their labels, all or nothing, a failed `test` being a 422; a status that
  moves from Pending to Running and Ready as the pod ages, and the events a scheduler and a
  kubelet record on the way (`objects.py`); fault switches for image pull failures,
  unschedulable pods and pods that never become Ready;
* secrets: create, get, list (by label), replace (PUT), delete; a pod's secret volumes are
  folders whose files change as soon as the secret does (a kubelet takes a minute or so);
* services: create, get, list (by label), delete; events: list (by field, e.g.
  `involvedObject.name=x`); NetworkPolicies (`networking.k8s.io/v1`): create and get, stored
  as sent and enforced by nothing;
* persistentvolumeclaims: create, get, list (by label), delete, a JSON patch of their
  labels; `Pending` until a pod that mounts one is scheduled, then `Bound`
  (WaitForFirstConsumer); a pod that names a missing claim stays Pending with the
  scheduler's `FailedScheduling` event; a claim deleted while a pod uses it stays (its
  `deletionTimestamp` set, the pvc-protection finalizer) until no pod does. Each claim's
  data is a folder under the server's root that lives as long as the claim;
* `pods/exec` over the `v5.channel.k8s.io` websocket, run as a process of this machine
  (`exec.py`) whose mount paths are folders under the server's root: a claim's folder (and
  its `subPath`), a secret's, an `emptyDir`'s (a folder of the pod, removed with it); a
  `/workspace` that no volume is mounted at is a folder of the pod too (its container's
  own filesystem), removed with it. `HOME` is the folder of the container's mount at the
  image's home (`image_home`) if it has one, else its `/workspace`;
* every object created, replaced or patched (the patch's result) is checked against the
  published schemas of Kubernetes 1.37 (PyPI `kubernetes-validate`, strict: unknown
  fields, types, required fields), a failure being a 422 `Invalid` with its cause;
* every failure as a `Status` object with the code and reason a real server uses, and a
  switch that fails the next REST requests with 500s.

What it does not model (so that nobody relies on it):

* authentication and authorization: any bearer token, or none, is accepted;
* scheduling (but for claims), nodes, images, probes, restarts, init containers (not run):
  the pod's "container" is whatever its execs run on this machine, unconfined; a deleted
  pod is gone at once (no grace period);
* persistent volumes, storage classes and their provisioners, sizes and access modes (a
  claim is bound to a volume that exists only in its name); `readOnly` mounts (execs run as
  this server's user); semantic validation beyond the schemas (names aside);
* watches, discovery, namespaces as objects, lists across namespaces, other PATCHes and PUTs, logs,
  attach, port-forward, resource versions; selectors other than `key=value` (refused);
* exec protocols older than v5 (refused), a container's `env` and `workingDir` (commands
  start in `/workspace`);
* only the exec's container's mount paths (and `/workspace`) in argv, and JSON strings
  starting with `/workspace` in stdin (how an ACP agent learns its `cwd`), are mapped to
  their folders: paths inside a shell script or glued to an option pass through;
* when the exec client goes away, the command's process group is killed at once (a real
  kubelet may leave it running); background processes a finished command left behind run on,
  as in a container, until the pod is deleted or the server stops.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import os
import shutil
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from .exec import (
    MAX_EXEC_MESSAGE,
    ExecRecord,
    ExecSession,
    kill_group,
    map_workspace,
    negotiate_subprotocol,
    parse_exec_options,
)
from .objects import (
    EVENT_FIELDS,
    PLAN_IMAGE_PULL,
    PLAN_NEVER_READY,
    PLAN_NORMAL,
    PLAN_UNSCHEDULABLE,
    ApiError,
    Cluster,
    Pod,
    bad_request,
    forbidden,
    internal_error,
    parse_go_bool,
    select,
)


def _list(kind: str, items: list[dict[str, Any]]) -> web.Response:
    # Items of a real list carry no kind/apiVersion of their own.
    return web.json_response(
        {
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {},
            "items": [
                {k: v for k, v in i.items() if k not in ("kind", "apiVersion")} for i in items
            ],
        }
    )


class KubeTestServer:
    """A Kubernetes API server on 127.0.0.1, running on its own thread and event loop.

    The knobs below are plain attributes that tests may set from their own thread at any time;
    the server thread reads them when it needs them. `ready_delay`, `never_ready`,
    `image_pull_backoff` and `unschedulable` are read when a pod is created and stay with that
    pod; the exec knobs on every exec (`exec_frame_size` on every read of the process output);
    `rest_failures` and `rest_delay` (seconds before each REST answer) on every request.
    """

    def __init__(self, root: str | os.PathLike[str], *, port: int = 0) -> None:
        self.root = Path(root)
        self.port = port
        # Knobs and fault switches.
        self.ready_delay = 0.2
        self.never_ready = False
        self.image_pull_backoff = False
        self.unschedulable = False
        self.rest_failures = 0
        self.rest_delay = 0.0
        self.exec_handshake_delay = 0.0
        self.exec_refused = False
        self.exec_frame_size = 65536
        # The home of the image's user: an exec's HOME is the folder mounted there, if any.
        self.image_home = "/home/craft"
        # What happened, appended on the server thread.
        self.execs: list[ExecRecord] = []
        self.requests: list[tuple[str, str]] = []

        self.cluster = Cluster()
        self.cluster.on_pod_deleted = self._pod_deleted
        self.cluster.on_claim_deleted = self._claim_deleted
        # Every exec process per pod, kept after the command ends: background processes it
        # left behind run on, as in a container, until the pod is deleted or the server stops.
        self._processes: dict[tuple[str, str], list[asyncio.subprocess.Process]] = {}
        self._execs: set[asyncio.Task[Any]] = set()  # exec handlers still running
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # -- public API ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KubeTestServer:
        """Start serving; returns once the socket is listening."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self.root.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(sock, ready), name="kube-test-server", daemon=True
        )
        self._thread.start()
        ready.result(timeout=30)
        return self

    def stop(self) -> None:
        """Kill every exec process, close connections and stop the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
            self._loop = self._thread = None

    def __enter__(self) -> KubeTestServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def workspace(self, namespace: str, pod_name: str) -> Path:
        """Return the local folder that is `/workspace` in that pod (its first container's):
        a volume's folder if one is mounted there, else a folder of the pod's own."""
        return self.folder(namespace, pod_name, "/workspace")

    def folder(self, namespace: str, pod_name: str, path: str, container: str = "") -> Path:
        """Return the local folder that is `path` in the pod's `container` (default: its
        first); a pod that is gone has only its own folder."""
        pod = self.cluster.pods.get((namespace, pod_name))
        if pod is None:
            return self.pod_folder(namespace, pod_name) / path.lstrip("/")
        mounts = self.mounts(namespace, pod, container or pod.containers[0]["name"])
        workspace = mounts.pop("/workspace", self.pod_folder(namespace, pod_name))
        local = map_workspace(path, workspace, mounts)
        if local == path:
            raise ValueError(f"{path} is on no volume of pod {pod_name}'s container")
        return Path(local)

    def pod_folder(self, namespace: str, pod_name: str) -> Path:
        """Return the pod's own folder: its container's `/workspace` when no volume is
        mounted there; removed with the pod."""
        return self.root / namespace / pod_name

    def claim_folder(self, namespace: str, name: str) -> Path:
        """Return the local folder of a claim's data (claim names never start with a dot,
        so it is no pod's folder); it lives as long as the claim."""
        return self.root / namespace / ".claims" / name

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        """Write a kubeconfig for this server; load it with `config.load_kube_config`."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-test", "cluster": {"server": self.url}}],
            "users": [{"name": "kube-test-user", "user": {"token": "kube-test-token"}}],
            "contexts": [
                {
                    "name": "kube-test",
                    "context": {
                        "cluster": "kube-test",
                        "user": "kube-test-user",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "kube-test",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def configuration(self) -> Any:
        """Return a `kubernetes.client.Configuration` pointing at this server."""
        from kubernetes import client  # imported lazily: only callers of this need it

        configuration = client.Configuration(host=self.url)
        configuration.api_key = {"authorization": "Bearer kube-test-token"}
        return configuration

    # -- thread and loop ----------------------------------------------------------------------

    def _serve(self, sock: socket.socket, ready: concurrent.futures.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_site(sock))
        except BaseException as exc:  # report startup failures to start()
            sock.close()
            loop.close()
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _start_site(self, sock: socket.socket) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        self._add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def _shutdown(self) -> None:
        for processes in self._processes.values():
            for process in processes:
                kill_group(process)
        execs = list(self._execs)
        for task in execs:
            task.cancel()
        await asyncio.gather(*execs, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    def _pod_deleted(self, namespace: str, name: str) -> None:
        """Stop the pod's processes; its own folder and its `emptyDir`s go with it."""
        for process in self._processes.pop((namespace, name), []):
            kill_group(process)
        shutil.rmtree(self.pod_folder(namespace, name), ignore_errors=True)
        shutil.rmtree(self.root / namespace / ".volumes" / name, ignore_errors=True)

    def _claim_deleted(self, namespace: str, name: str) -> None:
        shutil.rmtree(self.claim_folder(namespace, name), ignore_errors=True)

    # -- routing ------------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        ns = "/api/v1/namespaces/{namespace}"
        policies = "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
        app.router.add_post(ns + "/pods", self._create_pod)
        app.router.add_get(ns + "/pods", self._list_pods)
        app.router.add_get(ns + "/pods/{name}", self._get_pod)
        app.router.add_delete(ns + "/pods/{name}", self._delete_pod)
        app.router.add_patch(ns + "/pods/{name}", self._patch_pod)
        app.router.add_get(ns + "/pods/{name}/exec", self._exec)
        app.router.add_post(ns + "/pods/{name}/exec", self._exec)
        app.router.add_post(ns + "/services", self._create_service)
        app.router.add_get(ns + "/services", self._list_services)
        app.router.add_get(ns + "/services/{name}", self._get_service)
        app.router.add_delete(ns + "/services/{name}", self._delete_service)
        app.router.add_get(ns + "/events", self._list_events)
        app.router.add_post(ns + "/secrets", self._create_secret)
        app.router.add_get(ns + "/secrets", self._list_secrets)
        app.router.add_get(ns + "/secrets/{name}", self._get_secret)
        app.router.add_put(ns + "/secrets/{name}", self._replace_secret)
        app.router.add_delete(ns + "/secrets/{name}", self._delete_secret)
        app.router.add_post(ns + "/persistentvolumeclaims", self._create_claim)
        app.router.add_get(ns + "/persistentvolumeclaims", self._list_claims)
        app.router.add_get(ns + "/persistentvolumeclaims/{name}", self._get_claim)
        app.router.add_patch(ns + "/persistentvolumeclaims/{name}", self._patch_claim)
        app.router.add_delete(ns + "/persistentvolumeclaims/{name}", self._delete_claim)
        app.router.add_post(policies, self._create_network_policy)
        app.router.add_get(policies + "/{name}", self._get_network_policy)

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self.rest_delay > 0 and not request.path.endswith("/exec"):
            await asyncio.sleep(float(self.rest_delay))
        try:
            if self.rest_failures > 0 and not request.path.endswith("/exec"):
                self.rest_failures -= 1
                raise internal_error("injected failure (rest_failures)")
            return await handler(request)
        except ApiError as error:
            return error.response()
        except web.HTTPNotFound:
            return ApiError(
                404, "NotFound", "the server could not find the requested resource", {}
            ).response()
        except web.HTTPMethodNotAllowed as exc:
            return ApiError(
                405,
                "MethodNotAllowed",
                f"the server does not allow this method on the requested resource ({exc.method})",
                {},
            ).response()

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(f"the body of the request was in an unknown format: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        return body

    @staticmethod
    def _select(request: web.Request, items: list[dict[str, Any]], fields: set[str]) -> list:
        """Return the items a list request selects; refuse a watch (not modelled)."""
        query = request.query
        try:
            watching = parse_go_bool(query.get("watch", "false"))
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        if watching:
            raise bad_request("watch is not modelled by this test server")
        return select(items, query.get("labelSelector", ""), query.get("fieldSelector", ""), fields)

    # -- pods ---------------------------------------------------------------------------------

    def _pod_plan(self) -> str:
        if self.unschedulable:
            return PLAN_UNSCHEDULABLE
        if self.image_pull_backoff:
            return PLAN_IMAGE_PULL
        if self.never_ready:
            return PLAN_NEVER_READY
        return PLAN_NORMAL

    async def _create_pod(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        pod = self.cluster.create_pod(
            namespace,
            await self._body(request),
            plan=self._pod_plan(),
            ready_delay=float(self.ready_delay),
        )
        self.pod_folder(namespace, pod.name).mkdir(parents=True, exist_ok=True)
        return web.json_response(pod.obj, status=201)

    async def _get_pod(self, request: web.Request) -> web.Response:
        pod = self.cluster.get_pod(request.match_info["namespace"], request.match_info["name"])
        return web.json_response(pod.obj)

    async def _list_pods(self, request: web.Request) -> web.Response:
        pods = [pod.obj for pod in self.cluster.list_pods(request.match_info["namespace"])]
        return _list("PodList", self._select(request, pods, set()))

    async def _patch_pod(self, request: web.Request) -> web.Response:
        operations = await self._json_patch(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.patch_pod_labels(namespace, name, operations).obj)

    @staticmethod
    async def _json_patch(request: web.Request) -> list[Any]:
        if request.content_type != "application/json-patch+json":
            raise ApiError(
                415, "UnsupportedMediaType",
                f"only JSON patches are modelled by this test server, not {request.content_type}",
                {},
            )  # fmt: skip
        try:
            operations = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(f"the body of the request was in an unknown format: {exc}") from None
        if not isinstance(operations, list):
            raise bad_request("a JSON patch must be a list of operations")
        return operations

    async def _delete_pod(self, request: web.Request) -> web.Response:
        # DeleteOptions (gracePeriodSeconds, propagationPolicy, ...) are accepted and ignored.
        pod = self.cluster.delete_pod(request.match_info["namespace"], request.match_info["name"])
        return web.json_response(pod.obj)

    # -- services -----------------------------------------------------------------------------

    async def _create_service(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        service = self.cluster.create_service(namespace, await self._body(request))
        return web.json_response(service, status=201)

    async def _get_service(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.get_service(namespace, name))

    async def _list_services(self, request: web.Request) -> web.Response:
        services = self.cluster.list_services(request.match_info["namespace"])
        return _list("ServiceList", self._select(request, services, set()))

    async def _delete_service(self, request: web.Request) -> web.Response:
        # Since Kubernetes 1.23 deleting a service returns the deleted Service (the generated
        # client types the answer as V1Service), not a Status.
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.delete_service(namespace, name))

    # -- secrets: stored, and written out as the files a pod that mounts them sees -------------

    def secret_folder(self, namespace: str, name: str) -> Path:
        """Return the local folder a pod that mounts secret `name` sees at its mount path
        (pod names never start with a dot, so it is no pod's workspace)."""
        return self.root / namespace / ".secrets" / name

    def _write_secret_files(self, namespace: str, secret: dict[str, Any] | None, name: str) -> None:
        # At once: a real kubelet refreshes mounted secrets only every minute or so.
        folder = self.secret_folder(namespace, name)
        shutil.rmtree(folder, ignore_errors=True)
        if secret is None:
            return
        folder.mkdir(parents=True, mode=0o700)
        for key, value in secret["data"].items():
            (folder / key).write_bytes(base64.b64decode(value))

    async def _create_secret(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        secret = self.cluster.create_secret(namespace, await self._body(request))
        self._write_secret_files(namespace, secret, secret["metadata"]["name"])
        return web.json_response(secret, status=201)

    async def _replace_secret(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        secret = self.cluster.replace_secret(namespace, name, await self._body(request))
        self._write_secret_files(namespace, secret, name)
        return web.json_response(secret)

    async def _get_secret(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.get_secret(namespace, name))

    async def _list_secrets(self, request: web.Request) -> web.Response:
        secrets = self.cluster.list_secrets(request.match_info["namespace"])
        return _list("SecretList", self._select(request, secrets, set()))

    async def _delete_secret(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        secret = self.cluster.delete_secret(namespace, name)
        self._write_secret_files(namespace, None, name)
        return web.json_response(secret)

    def mounts(self, namespace: str, pod: Pod, container: str) -> dict[str, Path]:
        """Return the container's volume mounts: mount path -> local folder, made if need be
        (a kubelet makes a missing `subPath`).

        A secret volume is the secret's folder; a claim's is the claim's folder
        (`claim_folder`); an `emptyDir`'s a folder of the pod's, removed with it; each plus
        the mount's `subPath`. Only the container's own mounts are mapped: another
        container's volume is not there (its path passes through, and is missing on this
        machine). `readOnly` is not enforced (execs run as this server's user).
        """
        sources: dict[str, tuple[Path, bool]] = {}  # volume -> (folder, made when mounted)
        for volume in pod.obj["spec"].get("volumes") or []:
            name = volume["name"]
            if isinstance(volume.get("secret"), dict):
                secret = volume["secret"].get("secretName", "")
                sources[name] = (self.secret_folder(namespace, secret), False)
            elif isinstance(volume.get("persistentVolumeClaim"), dict):
                claim = volume["persistentVolumeClaim"].get("claimName", "")
                sources[name] = (self.claim_folder(namespace, claim), True)
            elif isinstance(volume.get("emptyDir"), dict):
                sources[name] = (self.volume_folder(namespace, pod.name, name), True)
        mounts = {}
        for spec in pod.obj["spec"].get("containers") or []:
            if spec.get("name") != container:
                continue
            for mount in spec.get("volumeMounts") or []:
                if mount.get("name") not in sources:
                    continue
                source, made = sources[mount["name"]]
                sub_path = mount.get("subPath") or ""
                if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                    raise bad_request(f"subPath {sub_path!r} must be a relative path")
                folder = source / sub_path if sub_path else source
                if made:
                    folder.mkdir(parents=True, exist_ok=True)
                mounts[mount["mountPath"]] = folder
        return mounts

    def volume_folder(self, namespace: str, pod_name: str, volume: str) -> Path:
        """Return the local folder of a pod's `emptyDir` volume; removed with the pod."""
        return self.root / namespace / ".volumes" / pod_name / volume

    # -- persistent volume claims --------------------------------------------------------------

    async def _create_claim(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        claim = self.cluster.create_claim(namespace, await self._body(request))
        self.claim_folder(namespace, claim["metadata"]["name"]).mkdir(parents=True)
        return web.json_response(claim, status=201)

    async def _get_claim(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.get_claim(namespace, name))

    async def _list_claims(self, request: web.Request) -> web.Response:
        claims = self.cluster.list_claims(request.match_info["namespace"])
        return _list("PersistentVolumeClaimList", self._select(request, claims, set()))

    async def _patch_claim(self, request: web.Request) -> web.Response:
        operations = await self._json_patch(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.patch_claim_labels(namespace, name, operations))

    async def _delete_claim(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.delete_claim(namespace, name))

    # -- events and network policies ----------------------------------------------------------

    async def _list_events(self, request: web.Request) -> web.Response:
        events = self.cluster.list_events(request.match_info["namespace"])
        return _list("EventList", self._select(request, events, EVENT_FIELDS))

    async def _create_network_policy(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        policy = self.cluster.create_network_policy(namespace, await self._body(request))
        return web.json_response(policy, status=201)

    async def _get_network_policy(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return web.json_response(self.cluster.get_network_policy(namespace, name))

    # -- exec ---------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        if self.exec_handshake_delay > 0:
            await asyncio.sleep(float(self.exec_handshake_delay))
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        # Authorization comes before anything else in a real API server.
        if self.exec_refused:
            raise forbidden("pods", "exec", name, namespace)
        pod = self.cluster.get_pod(namespace, name)
        options = parse_exec_options(request.query, name, [c["name"] for c in pod.containers])
        self._require_running(pod, options.container)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise bad_request("Upgrade request required")
        protocol = negotiate_subprotocol(request.headers.get("Sec-WebSocket-Protocol"))
        ws = web.WebSocketResponse(
            protocols=(protocol,), max_msg_size=MAX_EXEC_MESSAGE, compress=False, decode_text=False
        )
        await ws.prepare(request)
        record = ExecRecord(namespace, name, options.container, list(options.command), protocol)
        self.execs.append(record)
        mounts = self.mounts(namespace, pod, options.container)
        workspace = mounts.pop("/workspace", self.pod_folder(namespace, name))
        workspace.mkdir(parents=True, exist_ok=True)
        home = mounts.get(self.image_home, workspace)
        session = ExecSession(
            ws,
            record,
            options,
            workspace,
            {**os.environ, "HOSTNAME": name, "HOME": str(home)},
            mounts=mounts,
            frame_size=lambda: self.exec_frame_size,
            on_spawn=lambda process: self._processes.setdefault((namespace, name), []).append(
                process
            ),
        )
        task = asyncio.current_task()
        assert task is not None
        self._execs.add(task)
        try:
            await session.run()
        finally:
            self._execs.discard(task)
        return ws

    @staticmethod
    def _require_running(pod: Pod, container: str) -> None:
        if pod.obj["status"].get("phase") == "Running":
            return
        if not pod.obj["spec"].get("nodeName"):
            raise bad_request(f"pod {pod.name} does not have a host assigned")
        raise bad_request(f'pod {pod.name} is not running: container not found ("{container}")')
