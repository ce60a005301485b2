"""The kubernetes backend: a sandbox is a pod (plus a headless Service), agents run by exec.

Each sandbox is one pod named `craft-sandbox-<sandbox uuid>` on a PersistentVolumeClaim of
the same name, which holds everything that must outlive the pod: the workspaces at
`/workspace` (a session's is `/workspace/sessions/<session uuid>`, its checkpoints beside
them), the sandbox user's home (agents keep their own session files there) and Craft's git
stores. A pod that goes (evicted, deleted, put to sleep) is replaced on the same claim. The
agent of a session runs through pod exec (stdin, stdout, stderr, no tty), one exec per
cached agent connection, reused across prompts exactly as a local subprocess would be.

Two kinds of API client, on purpose. `kubernetes.stream.stream()` swaps `call_api` on the
ApiClient behind the API object it is given while it runs (kubernetes-client/python issue
#928): a REST call made on that ApiClient from another thread in that window is sent as a
websocket handshake and fails with `ApiException(status=0, reason="Handshake status 200 OK")`,
and two overlapping streams can leave the patch installed for good. Craft's exec transport
calls neither `stream()` nor the private function behind it, and swaps nothing (it builds its
request with the public `ApiClient.param_serialize`, see `kubernetes_exec.exec_request`);
still, the REST ApiClient is never handed to an exec and every exec gets an ApiClient of its
own, so that no later use of `stream()` can bring the bug back.

The exec transport itself (the websocket, its frames and deadlines) is `kubernetes_exec.py`;
only these two modules import the kubernetes client.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from ..catalog import Launch, default_agent
from ..repository import Repository
from ..workspace import Workspace
from . import ports
from .base import Health, Progress, Resource, SandboxError, WarmState, WarmUnusable
from .kubernetes_exec import ExecByteStream, ExecProcess, ExecResult, ExecTerminal

if TYPE_CHECKING:
    from sandboxes.models import Sandbox

CONTAINER = "sandbox"
WORKSPACE = "/workspace"
# The sandbox image's home (deploy/sandbox-image/Dockerfile: the user `craft`), on the claim.
HOME = "/home/craft"
# The pod's one volume of data, from the sandbox's claim, and the folders of the claim each
# mount takes (subPath).
DATA_VOLUME = "data"
WORKSPACE_SUBPATH = "workspace"
HOME_SUBPATH = "home"
GIT_SUBPATH = "git"
# Made by an init container as the sandbox's user before the others mount them: a subPath
# the kubelet has to make itself is made by root, and the sandbox's user could not write it.
MAKE_DATA_FOLDERS = (
    f'mkdir -p "$1/{WORKSPACE_SUBPATH}/sessions" "$1/{HOME_SUBPATH}" "$1/{GIT_SUBPATH}"'
)
DATA_MOUNT = "/craft-data"
# Craft's git (`sandboxes.repository`): a container of the pod of its own, where the owner's
# token goes, with the sessions' git stores on a volume that only it may write.
GIT_CONTAINER = "git"
GIT_STORES = "/craft-git"
GIT_RESOURCES = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
# The set-up of a repository, run as the agent runs: in the session's workspace, its output
# as one stream, and the whole process group killed past its time (GNU timeout signals its
# group; a kubelet does not stop what an exec started when its stream goes away).
SETUP = 'cd "$1" && t=$2 && shift 2 && exec timeout -k 5 "$t" "$@" 2>&1'
POD_PREFIX = "craft-sandbox-"
# Waiting reasons after which a pod will not become ready without someone fixing something.
FATAL_WAITING_REASONS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
}
# Run the agent in its workspace without building a shell string from data: the script is a
# constant, the workspace and the agent's argv are its positional arguments.
# The session's workspace is made at its agent's first start (a new session touches nothing).
CD_AND_EXEC = 'mkdir -p "$1" && cd "$1" && shift && exec "$@"'
# A terminal's shell, in the session's workspace: bash if the image has it, else sh.
TERMINAL_SHELL = (
    'mkdir -p "$1" && cd "$1" && export TERM=xterm-256color && '
    "if command -v bash >/dev/null 2>&1; then SHELL=$(command -v bash) exec bash; fi; "
    "SHELL=/bin/sh exec sh"
)
# Where the sandbox's Secret (its owner's credentials) is mounted in the pod.
CREDENTIALS = "/run/craft/credentials"
# The agent's start when it needs credentials: for each `NAME=revision` before `--`, wait
# until the mounted Secret has that revision of NAME (the kubelet refreshes mounted Secrets
# a minute or so after a change), export NAME from its file, then go on as CD_AND_EXEC.
# Only names and random revisions are on this command line (it ends up in the API server's
# audit log, in the exec URL): the values are read inside the pod.
CREDENTIALS_AND_EXEC = """\
ws=$1 dir=$2 wait=$3
shift 3
while [ "$1" != -- ]; do
  name=${1%%=*} rev=${1#*=}
  shift
  waited=0
  until [ "$(cat "$dir/$name.rev" 2>/dev/null)" = "$rev" ]; do
    if [ "$waited" -ge "$wait" ]; then
      echo "craft: $name has not reached the sandbox yet; try again in a minute" >&2
      exit 75
    fi
    waited=$((waited + 1))
    sleep 1
  done
  export "$name=$(cat "$dir/$name")"
done
shift
mkdir -p "$ws" && cd "$ws" && exec "$@"
"""

# The pod's TCP tables (no IPv6 in the pod: the first alone).
LISTENING_TABLES = "cat /proc/net/tcp; cat /proc/net/tcp6 2>/dev/null; true"
# One policy per sandbox namespace, for every sandbox pod in it.
NETWORK_POLICY = "craft-sandbox-isolation"
SANDBOX_LABEL = {"app.kubernetes.io/name": "craft-sandbox"}
# How Craft finds its pods and services again (the inventory): labels it sets on both.
MANAGED_SELECTOR = "app.kubernetes.io/name=craft-sandbox,app.kubernetes.io/managed-by=craft"
SANDBOX_ID_LABEL = "craft.dev/sandbox"
OWNER_LABEL = "craft.dev/owner"
# On a warm pod (and its Secret) until a sandbox claims it; the claim removes it with a JSON
# patch that first tests it is still "true", so that a pod is never claimed twice.
WARM_LABEL = "craft.dev/warm"
WARM_SELECTOR = f"{MANAGED_SELECTOR},{WARM_LABEL}=true"


def load_configuration() -> k8s.Configuration:
    """Return client configuration: in-cluster when running in a pod, else a kubeconfig."""
    configuration = k8s.Configuration()
    kubeconfig = settings.CRAFT_K8S_KUBECONFIG or os.environ.get("KUBECONFIG")
    try:
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (k8s_config.ConfigException, OSError) as exc:
        raise SandboxError(f"cannot load Kubernetes configuration: {exc}") from exc
    return configuration


def pod_name(sandbox: Sandbox) -> str:
    return _pod_name(sandbox.id)


def secret_name(sandbox: Sandbox) -> str:
    return _secret_name(sandbox.id)


def _pod_name(sandbox_id: UUID) -> str:
    return f"{POD_PREFIX}{sandbox_id}"


def _secret_name(sandbox_id: UUID) -> str:
    return f"{POD_PREFIX}{sandbox_id}-credentials"


def claim_name(sandbox: Sandbox) -> str:
    return _pod_name(sandbox.id)  # the claim is named like its pod


def _label_path(key: str) -> str:
    """Return the JSON Pointer (RFC 6901) of a label, for a JSON patch."""
    return "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")


T = TypeVar("T")


def _is_status(exc: ApiException, *codes: int) -> bool:
    return exc.status in codes


def _create_or_read(create: Callable[[], object], read: Callable[[], T], what: str) -> T | None:
    """Create an object, or read the one already standing in its name: None when `create`
    made it, else what `read` found (one that vanished in between is created again). Raise
    SandboxError naming `what` for any other refusal."""
    while True:
        try:
            create()
            return None
        except ApiException as exc:
            if not _is_status(exc, 409):
                raise SandboxError(f"cannot create {what}: {_reason(exc)}") from exc
        try:
            return read()
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot read {what}: {_reason(exc)}") from exc


class KubernetesBackend:
    """Sandboxes as pods; blocking calls, made from worker threads."""

    name = "kubernetes"
    start_slots = None  # agents start in their pods, on the cluster's CPUs

    def __init__(
        self,
        configuration: k8s.Configuration | None = None,
        *,
        rest_client: k8s.ApiClient | None = None,
        exec_api_client: Callable[[], k8s.ApiClient] | None = None,
    ) -> None:
        """Connect with `configuration` (default: in-cluster, else kubeconfig).

        `rest_client` and `exec_api_client` exist for tests; in particular, the test that
        shows that execs leave their ApiClient alone passes the same client for both.
        """
        self.configuration = configuration or load_configuration()
        # The REST client. Never pass it (or an API object built on it) to stream(): #928.
        self.rest_client = rest_client or k8s.ApiClient(self.configuration)
        self.core = k8s.CoreV1Api(self.rest_client)
        self.networking = k8s.NetworkingV1Api(self.rest_client)
        self._policy_namespaces: set[str] = set()  # where this process saw the policy exist
        # One fresh ApiClient per exec, so that no two streams ever share one either.
        self._exec_api_client = exec_api_client or (lambda: k8s.ApiClient(self.configuration))
        # Each sandbox's pod address, by (sandbox id, pod reference): for previews.
        self._pod_ips: dict[tuple[Any, str], str] = {}

    @property
    def namespace(self) -> str:
        return settings.CRAFT_K8S_NAMESPACE

    # --- lifecycle ------------------------------------------------------------------------

    def provision(self, sandbox: Sandbox, progress: Progress) -> str:
        name = pod_name(sandbox)
        # Before the pod: a sandbox must never run without its network policy.
        self._ensure_network_policy()
        # Before the pod, which mounts them: the credentials its owner's agents get, and the
        # claim that holds its files (adopted when it exists: a pod that went left it).
        self._ensure_credentials_secret(sandbox)
        self._create_or_adopt_claim(sandbox, progress)
        progress("creating pod")
        self._create_or_adopt_pod(sandbox, progress)
        self._create_or_adopt_service(sandbox)
        self._wait_until_ready(name, progress)
        return name

    def _create_or_adopt_pod(self, sandbox: Sandbox, progress: Progress) -> None:
        """Create the sandbox's pod; adopt one that exists and may still become ready.

        A pod left by an earlier attempt that failed (a bad image, unschedulable) is
        replaced, so that a retry after the cause is fixed gets a new pod; one being deleted
        is waited for, within CRAFT_K8S_READY_TIMEOUT.
        """
        name = pod_name(sandbox)
        deadline = time.monotonic() + settings.CRAFT_K8S_READY_TIMEOUT
        while True:
            # Made, or it exists already (a retry, or another worker).
            existing = _create_or_read(
                lambda: self.core.create_namespaced_pod(self.namespace, self.pod_manifest(sandbox)),
                lambda: self.core.read_namespaced_pod(name, self.namespace),
                "pod",
            )
            if existing is None:
                return
            going = existing.metadata.deletion_timestamp is not None
            failure = pod_failure(existing)
            if not going and not failure:
                if (existing.metadata.labels or {}).get(WARM_LABEL) == "true":
                    # A warm pod this sandbox took, whose claim was cut short (its server
                    # stopped): finish the claim, then wait for it as for any pod.
                    # (Its claim got the owner's labels when it was adopted, before.)
                    self._relabel_warm(sandbox)
                    self._bind_secret(sandbox)
                return  # adopt it
            if time.monotonic() >= deadline:
                raise SandboxError("the previous pod of this sandbox is still terminating")
            if going:
                progress("waiting for the previous pod to be deleted")
            else:
                progress(f"replacing the pod that failed ({failure})")
                self._delete_pod(name)
            time.sleep(settings.CRAFT_K8S_POLL_INTERVAL)

    def _create_or_adopt_claim(self, sandbox: Sandbox, progress: Progress) -> None:
        """Create the sandbox's PersistentVolumeClaim, or adopt the one it has (409).

        An adopted claim gets its owner's labels (a warm pod's claim whose hand-over was cut
        short has none). One being deleted (a pvc-protection finalizer keeps it while a pod
        uses it) cannot be mounted: it is waited for, within CRAFT_K8S_READY_TIMEOUT, and
        made anew.
        """
        name = claim_name(sandbox)
        deadline = time.monotonic() + settings.CRAFT_K8S_READY_TIMEOUT
        while True:
            existing = _create_or_read(
                lambda: self.core.create_namespaced_persistent_volume_claim(
                    self.namespace, self.claim_manifest(sandbox)
                ),
                lambda: self.core.read_namespaced_persistent_volume_claim(name, self.namespace),
                "the volume claim",
            )
            if existing is None:
                return
            if existing.metadata.deletion_timestamp is None:
                if (existing.metadata.labels or {}) != self.labels(sandbox):
                    self._bind_claim(sandbox)
                return
            if time.monotonic() >= deadline:
                raise SandboxError(
                    "the previous volume claim of this sandbox is still being deleted"
                )
            progress("waiting for the previous volume claim to be deleted")
            time.sleep(settings.CRAFT_K8S_POLL_INTERVAL)

    def _bind_claim(self, sandbox: Sandbox) -> None:
        """Give the sandbox's claim its owner's labels (a warm claim's have none)."""
        operations = [{"op": "add", "path": "/metadata/labels", "value": self.labels(sandbox)}]
        try:
            self.core.patch_namespaced_persistent_volume_claim(
                claim_name(sandbox),
                self.namespace,
                operations,
                _content_type="application/json-patch+json",
            )
        except ApiException as exc:
            raise SandboxError(f"cannot relabel the volume claim: {_reason(exc)}") from exc

    def _delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot delete the failed pod: {_reason(exc)}") from exc

    def disk_usage(self, sandbox: Sandbox) -> int | None:
        # Not measured: the sandbox's files are bounded by its claim (CRAFT_K8S_WORKSPACE_SIZE).
        return None

    def check_isolation(self) -> None:
        # Someone may have deleted the policy: ask again (a 409 means it is there).
        self._policy_namespaces.discard(self.namespace)
        self._ensure_network_policy()

    def _ensure_network_policy(self) -> None:
        """Create the namespace's sandbox NetworkPolicy unless it exists (409: adopt it)."""
        namespace = self.namespace
        if namespace in self._policy_namespaces:
            return
        try:
            self.networking.create_namespaced_network_policy(
                namespace, self.network_policy_manifest()
            )
        except ApiException as exc:
            if not _is_status(exc, 409):
                raise SandboxError(f"cannot create the network policy: {_reason(exc)}") from exc
        self._policy_namespaces.add(namespace)

    def _create_or_adopt_service(self, sandbox: Sandbox) -> None:
        try:
            self.core.create_namespaced_service(self.namespace, self.service_manifest(sandbox))
        except ApiException as exc:
            if not _is_status(exc, 409):
                raise SandboxError(f"cannot create service: {_reason(exc)}") from exc

    def _wait_until_ready(self, name: str, progress: Progress) -> None:
        deadline = time.monotonic() + settings.CRAFT_K8S_READY_TIMEOUT
        phase = "Unknown"
        while time.monotonic() < deadline:
            try:
                pod = self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as exc:
                raise SandboxError(f"cannot read pod: {_reason(exc)}") from exc
            phase = pod.status.phase if pod.status else "Unknown"
            if pod_is_ready(pod):
                progress("ready")
                return
            failure = pod_failure(pod)
            if failure:
                raise SandboxError(failure)
            # At every poll: the caller may stop provisioning here (it raises).
            progress(f"pod {phase}" + (f": {e}" if (e := self._latest_event(name)) else ""))
            time.sleep(settings.CRAFT_K8S_POLL_INTERVAL)
        raise SandboxError(
            f"pod not ready after {settings.CRAFT_K8S_READY_TIMEOUT:g} s (phase {phase})"
        )

    def _latest_event(self, name: str) -> str:
        try:
            events = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={name}"
            ).items
        except ApiException:
            return ""  # progress is a courtesy; never fail provisioning over it
        if not events:
            return ""

        def when(event: Any) -> float:
            stamp = event.last_timestamp or event.first_timestamp or event.event_time
            return stamp.timestamp() if stamp else 0.0

        latest = max(events, key=when)
        return f"{latest.reason}: {latest.message}" if latest.message else str(latest.reason)

    def sleep(self, sandbox: Sandbox) -> None:
        """Delete the sandbox's pod only: its claim (every file, the agents' memory), its
        Secret and its Service stay for the pod that `provision` makes next. Gone already
        counts as done."""
        try:
            self.core.delete_namespaced_pod(
                pod_name(sandbox), self.namespace, grace_period_seconds=5
            )
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot delete the pod: {_reason(exc)}") from exc

    def terminate(self, sandbox: Sandbox) -> None:
        """Delete the pod, the service, the credentials Secret and the volume claim (every
        file of the sandbox), each on its own; gone already counts as deleted."""
        self._delete_each(
            (
                (self.core.delete_namespaced_pod, pod_name(sandbox)),
                (self.core.delete_namespaced_service, pod_name(sandbox)),
                (self.core.delete_namespaced_secret, secret_name(sandbox)),
                (self.core.delete_namespaced_persistent_volume_claim, claim_name(sandbox)),
            ),
            grace_period_seconds=5,
        )

    def _delete_each(
        self, deletions: Iterable[tuple[Callable[..., object], str]], grace_period_seconds: int
    ) -> None:
        """Make each deletion, on its own (gone already counts as deleted); then raise
        SandboxError naming every one that failed."""
        errors = []
        for delete, name in deletions:
            try:
                delete(name, self.namespace, grace_period_seconds=grace_period_seconds)
            except ApiException as exc:
                if not _is_status(exc, 404):
                    errors.append(f"{delete.__name__}: {_reason(exc)}")
        if errors:
            raise SandboxError("; ".join(errors))

    def health(self, sandbox: Sandbox) -> Health:
        try:
            pod = self.core.read_namespaced_pod(pod_name(sandbox), self.namespace)
        except ApiException as exc:
            if _is_status(exc, 404):
                return Health(False, "the sandbox's pod is gone", gone=True)
            return Health(False, f"pod unreadable: {_reason(exc)}")
        if pod.metadata.deletion_timestamp is not None:
            return Health(False, "the sandbox's pod is being deleted", gone=True)
        if pod_is_ready(pod):
            return Health(True, "pod ready")
        return Health(False, pod_failure(pod) or f"pod {pod.status.phase}")

    # --- warm sandboxes (CRAFT_K8S_WARM_SANDBOXES; the pool is sandboxes/warm.py) ---------

    def warm_target(self) -> int:
        return settings.CRAFT_K8S_WARM_SANDBOXES

    def create_warm(self, sandbox_id: UUID) -> None:
        """Create a warm pod, its empty credentials Secret and its blank volume claim (which
        the sandbox that takes the pod keeps), labelled warm and with no owner, after the
        namespace's NetworkPolicy as for any sandbox pod. It does not wait for the pod: the
        pool's next pass finds it Ready."""
        self._ensure_network_policy()
        labels = self.warm_labels(sandbox_id)
        secret = self._secret_manifest(sandbox_id, labels, {})
        claim = self._claim_manifest(sandbox_id, labels)
        for create, manifest, what in (
            (self.core.create_namespaced_secret, secret, "credentials secret"),
            (self.core.create_namespaced_persistent_volume_claim, claim, "volume claim"),
            (self.core.create_namespaced_pod, self._pod_manifest(sandbox_id, labels), "pod"),
        ):
            try:
                create(self.namespace, manifest)
            except ApiException as exc:
                if not _is_status(exc, 409):
                    raise SandboxError(f"cannot create a warm {what}: {_reason(exc)}") from exc

    def warm_states(self) -> dict[UUID, WarmState]:
        """Return the unclaimed warm pods (not being deleted) by sandbox id, from one list."""
        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=WARM_SELECTOR).items
        except ApiException as exc:
            raise SandboxError(f"cannot list warm pods: {_reason(exc)}") from exc
        except (HTTPError, OSError) as exc:
            raise SandboxError(f"cannot reach the Kubernetes API: {exc}") from exc
        states = {}
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                continue
            try:
                sandbox_id = UUID((pod.metadata.labels or {}).get(SANDBOX_ID_LABEL, ""))
            except ValueError:
                continue
            states[sandbox_id] = WarmState(pod_is_ready(pod), pod_failure(pod))
        return states

    def claim_warm(self, sandbox: Sandbox, progress: Progress) -> str:
        """Give the warm pod named for `sandbox.id` to the sandbox's owner; return its name.

        The pod must be Ready now (read, not remembered): one that is gone, being deleted,
        failed or not Ready is dropped, and WarmUnusable says to provision a fresh pod. The
        relabelling is one JSON patch whose first operation tests that the pod is still
        warm; the API server applies all of it or none, so two claims of one pod cannot both
        succeed (the database row is the first guard; this is the pod's own). Then its
        credentials Secret is bound to the owner (their labels; its data is written at an
        agent's start, as for a fresh pod, and the start waits for the mounted revision),
        its volume claim gets the owner's labels (the owner keeps it: it is the sandbox's
        from now on), and its Service is created. The NetworkPolicy selects the pod by a
        label it has had since it was created.
        """
        name = pod_name(sandbox)
        progress("claiming a warm pod")
        self._ensure_network_policy()
        try:
            pod = self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot read the warm pod: {_reason(exc)}") from exc
            pod = None
        labels = (pod.metadata.labels or {}) if pod is not None else {}
        if pod is not None and labels.get(WARM_LABEL) != "true":
            if labels.get(OWNER_LABEL) == str(sandbox.owner_id):  # claimed already
                self._bind_claim(sandbox)
                self._create_or_adopt_service(sandbox)
                return name
            raise SandboxError(f"the warm pod {name} belongs to someone else")
        if pod is None:
            why = "it is gone"
        elif pod.metadata.deletion_timestamp is not None:
            why = "it is being deleted"
        elif not pod_is_ready(pod):
            phase = pod.status.phase if pod.status else "Unknown"
            why = pod_failure(pod) or f"it is not Ready (pod {phase})"
        else:
            why = ""
        if not why and not self._relabel_warm(sandbox):
            why = "it is gone"
        if why:
            self.remove_warm(sandbox.id)
            raise WarmUnusable(f"the warm pod {name} cannot be used: {why}")
        return self._finish_claim(sandbox, progress)

    def _relabel_warm(self, sandbox: Sandbox) -> bool:
        """Turn the warm pod into the sandbox's owner's; return False if it is gone.

        One JSON patch: test that it is still warm, remove that label, add the owner's.
        """
        name = pod_name(sandbox)
        operations = [
            {"op": "test", "path": _label_path(WARM_LABEL), "value": "true"},
            {"op": "remove", "path": _label_path(WARM_LABEL)},
            {"op": "add", "path": _label_path(OWNER_LABEL), "value": str(sandbox.owner_id)},
        ]
        try:
            self.core.patch_namespaced_pod(
                name, self.namespace, operations, _content_type="application/json-patch+json"
            )
        except ApiException as exc:
            if _is_status(exc, 422):
                raise SandboxError(f"the warm pod {name} was claimed by someone else") from exc
            if _is_status(exc, 404):
                return False
            raise SandboxError(f"cannot relabel the warm pod: {_reason(exc)}") from exc
        return True

    def _bind_secret(self, sandbox: Sandbox) -> None:
        """Give the warm pod's credentials Secret its owner's labels (and no data)."""
        manifest = self.secret_manifest(sandbox, {})
        try:
            self.core.replace_namespaced_secret(secret_name(sandbox), self.namespace, manifest)
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot bind the credentials secret: {_reason(exc)}") from exc
            self._ensure_credentials_secret(sandbox)

    def _finish_claim(self, sandbox: Sandbox, progress: Progress) -> str:
        self._bind_secret(sandbox)
        self._bind_claim(sandbox)
        self._create_or_adopt_service(sandbox)
        progress("ready")
        return pod_name(sandbox)

    def remove_warm(self, sandbox_id: UUID) -> None:
        """Delete a warm pod (at once: nobody uses it), its Secret and its blank volume
        claim; 404 counts as done."""
        self._delete_each(
            (
                (self.core.delete_namespaced_pod, _pod_name(sandbox_id)),
                (self.core.delete_namespaced_secret, _secret_name(sandbox_id)),
                (self.core.delete_namespaced_persistent_volume_claim, _pod_name(sandbox_id)),
            ),
            grace_period_seconds=0,
        )

    def inventory(self) -> list[Resource]:
        """Return Craft's sandbox pods, services, credentials Secrets and volume claims in
        the namespace, found by their labels.

        Pods and claims already being deleted are left out: they are on their way.
        """
        try:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=MANAGED_SELECTOR
            ).items
            services = self.core.list_namespaced_service(
                self.namespace, label_selector=MANAGED_SELECTOR
            ).items
            secrets = self.core.list_namespaced_secret(
                self.namespace, label_selector=MANAGED_SELECTOR
            ).items
            claims = self.core.list_namespaced_persistent_volume_claim(
                self.namespace, label_selector=MANAGED_SELECTOR
            ).items
        except ApiException as exc:
            raise SandboxError(f"cannot list sandbox pods and services: {_reason(exc)}") from exc
        except (HTTPError, OSError) as exc:
            raise SandboxError(f"cannot reach the Kubernetes API: {exc}") from exc
        found = []
        kinds = (("pod", pods), ("service", services), ("secret", secrets), ("claim", claims))
        for kind, items in kinds:
            for item in items:
                if kind in ("pod", "claim") and item.metadata.deletion_timestamp is not None:
                    continue
                try:
                    sandbox_id = UUID((item.metadata.labels or {}).get(SANDBOX_ID_LABEL, ""))
                except ValueError:
                    continue
                found.append(Resource(sandbox_id, kind, item.metadata.name))
        return found

    def remove(self, resource: Resource) -> None:
        delete = {
            "pod": self.core.delete_namespaced_pod,
            "service": self.core.delete_namespaced_service,
            "secret": self.core.delete_namespaced_secret,
            "claim": self.core.delete_namespaced_persistent_volume_claim,
        }[resource.kind]
        try:
            delete(resource.name, self.namespace, grace_period_seconds=5)
        except ApiException as exc:
            if not _is_status(exc, 404):
                raise SandboxError(f"cannot delete {resource}: {_reason(exc)}") from exc

    # --- workspaces and agents -----------------------------------------------------------

    def workspace_path(self, sandbox: Sandbox, session_id: UUID) -> str:
        # session_id is a UUID, so the path cannot leave /workspace/sessions.
        return f"{WORKSPACE}/sessions/{UUID(str(session_id))}"

    def remove_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        self._run(sandbox, ["rm", "-rf", "--", self.workspace_path(sandbox, session_id)])

    def warm_path(self, sandbox: Sandbox) -> str:
        # The volume's root: a folder of the pod that is no session's workspace.
        return WORKSPACE

    def make_workspace(self, sandbox: Sandbox, session_id: UUID) -> None:
        self._run(sandbox, ["mkdir", "-p", "--", self.workspace_path(sandbox, session_id)])

    def start_agent(
        self, sandbox: Sandbox, session_id: UUID, launch: Launch | None = None
    ) -> ExecProcess:
        """Start the launch's agent by exec; its credentials are written to the sandbox's
        Secret first and read from the mounted files in the pod, never put in the exec."""
        return self._start(sandbox, self.workspace_path(sandbox, session_id), launch)

    def start_warm_agent(self, sandbox: Sandbox, launch: Launch | None = None) -> ExecProcess:
        return self._start(sandbox, self.warm_path(sandbox), launch)

    def _start(self, sandbox: Sandbox, workspace: str, launch: Launch | None) -> ExecProcess:
        launch = launch or Launch(default_agent())
        command = launch.agent.command
        if not launch.secrets:
            return self.exec(sandbox, ["sh", "-c", CD_AND_EXEC, "sh", workspace, *command])
        revisions = self._write_credentials(sandbox, launch.secrets)
        wait = str(max(1, int(settings.CRAFT_AGENT_START_TIMEOUT) - 5))
        wanted = [f"{name}={revisions[name]}" for name in sorted(launch.secrets)]
        argv = ["sh", "-c", CREDENTIALS_AND_EXEC, "sh", workspace, CREDENTIALS, wait]
        redact = list(launch.secrets.values())
        return self.exec(sandbox, [*argv, *wanted, "--", *command], redact=redact)

    def start_terminal(
        self, sandbox: Sandbox, session_id: UUID, cols: int, rows: int
    ) -> ExecTerminal:
        """Start a shell on a terminal in the session's workspace by pod exec with a TTY, in
        the agent's container (its user, its environment; no credentials in the exec)."""
        return ExecTerminal(
            self._exec_api_client(),
            cols=cols,
            rows=rows,
            namespace=self.namespace,
            pod=pod_name(sandbox),
            container=CONTAINER,
            argv=["sh", "-c", TERMINAL_SHELL, "sh", self.workspace_path(sandbox, session_id)],
            handshake_timeout=settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT,
            idle_timeout=settings.CRAFT_K8S_EXEC_IDLE_TIMEOUT,
        )

    def _ensure_credentials_secret(self, sandbox: Sandbox) -> None:
        """Create the sandbox's (empty) credentials Secret unless it exists."""
        try:
            self.core.create_namespaced_secret(self.namespace, self.secret_manifest(sandbox, {}))
        except ApiException as exc:
            if not _is_status(exc, 409):
                raise SandboxError(f"cannot create the credentials secret: {_reason(exc)}") from exc

    def _write_credentials(self, sandbox: Sandbox, values: dict[str, str]) -> dict[str, str]:
        """Put `values` in the sandbox's Secret (keeping the others); return each one's
        revision, a random token that changes only when its value does."""
        name = secret_name(sandbox)
        for _ in range(5):
            try:
                secret = self.core.read_namespaced_secret(name, self.namespace)
            except ApiException as exc:
                if not _is_status(exc, 404):
                    raise SandboxError(
                        f"cannot read the credentials secret: {_reason(exc)}"
                    ) from exc
                secret = None
            current = {
                key: base64.b64decode(value).decode()
                for key, value in ((secret.data if secret else None) or {}).items()
            }
            wanted = dict(current)
            for key, value in values.items():
                if current.get(key) != value or f"{key}.rev" not in current:
                    wanted[key], wanted[f"{key}.rev"] = value, secrets.token_hex(8)
            revisions = {key: wanted[f"{key}.rev"] for key in values}
            if secret is not None and wanted == current:
                return revisions
            manifest = self.secret_manifest(sandbox, wanted)
            try:
                if secret is None:
                    self.core.create_namespaced_secret(self.namespace, manifest)
                else:
                    # Conditional on what was read: a concurrent start's write is never lost.
                    if secret.metadata.resource_version:
                        manifest["metadata"]["resourceVersion"] = secret.metadata.resource_version
                    self.core.replace_namespaced_secret(name, self.namespace, manifest)
            except ApiException as exc:
                if _is_status(exc, 409):
                    continue  # written meanwhile: read it again
                raise SandboxError(f"cannot write the credentials secret: {_reason(exc)}") from exc
            return revisions
        raise SandboxError("cannot write the credentials secret: it keeps changing")

    def workspace(self, sandbox: Sandbox, session_id: UUID) -> Workspace:
        """Read the session's workspace with the workspace tool, through pod exec on the exec
        client (never the REST client, which `stream()` would patch)."""
        relative = f"sessions/{UUID(str(session_id))}"
        command = [*settings.CRAFT_K8S_WORKSPACE_TOOL, WORKSPACE, relative]

        def run(args: list[str]) -> ExecByteStream:
            return ExecByteStream(
                self._exec_api_client(),
                keep_stdin=args[0] == "write",  # what to write comes on stdin
                namespace=self.namespace,
                pod=pod_name(sandbox),
                container=CONTAINER,
                argv=[*command, *args],
                handshake_timeout=settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT,
                idle_timeout=settings.CRAFT_K8S_EXEC_IDLE_TIMEOUT,
            )

        # Checkpoints live in the pod's volume, beside the sessions: the pod has one user, so
        # its agents could write them (a sandbox can only mislead its own user's review).
        stores, session = f"{WORKSPACE}/.craft-checkpoints", str(UUID(str(session_id)))
        return Workspace(
            run, run, f"{stores}/{session}", run_in_stores=run, stores=stores, session=session
        )

    def repository(self, sandbox: Sandbox, session_id: UUID) -> Repository:
        """Return the session's workspace as a git repository (`sandboxes.repository`).

        Steps that hold the owner's token (clone, fetch, push) and those that write the
        session's store run in the pod's `git` container, by exec on the exec client, the
        token on the exec's stdin (never in the exec's URL). The store is on a volume the
        agent's container mounts read-only: no token is ever in it, and only Craft's git
        writes it. Git in the workspace (whose `.git` is the agent's) runs in the agent's
        own container, never where a token goes.
        """
        return Repository(KubernetesGitRunner(self, sandbox, UUID(str(session_id))))

    def exec(self, sandbox: Sandbox, argv: list[str], redact: Iterable[str] = ()) -> ExecProcess:
        """Start `argv` in the sandbox's pod on a websocket of its own; `redact`: values its
        stderr must not show (its owner's credentials)."""
        return ExecProcess(
            self._exec_api_client(),
            namespace=self.namespace,
            pod=pod_name(sandbox),
            container=CONTAINER,
            argv=argv,
            handshake_timeout=settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT,
            idle_timeout=settings.CRAFT_K8S_EXEC_IDLE_TIMEOUT,
            redact=redact,
        )

    def _run(self, sandbox: Sandbox, argv: list[str]) -> ExecResult:
        process = self.exec(sandbox, argv)
        process.close_stdin()
        result = process.wait(settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT + 30)
        if result.exit_code != 0:
            raise SandboxError(
                f"{argv[0]} failed in the sandbox (exit {result.exit_code}): {result.stderr}"
            )
        return result

    # --- previews (docs/workbench.md) -------------------------------------------------------

    def listening_ports(self, sandbox: Sandbox) -> list[int]:
        """Return the TCP ports listening in the pod (its network namespace's tables, read by
        an exec in the sandbox's container)."""
        result = self._run(sandbox, ["sh", "-c", LISTENING_TABLES])
        return ports.ports(ports.parse(result.stdout.decode("ascii", "replace")))

    def preview_connect(self, sandbox: Sandbox, port: int, timeout: float) -> socket.socket:
        """Return a socket connected to `port` on the pod's IP (`status.podIP`, read once per
        pod and again when a connection fails). The app must listen on the pod's interface
        (0.0.0.0), not only on its loopback."""
        for fresh in (False, True):
            address = self._pod_ip(sandbox, fresh)
            try:
                return socket.create_connection((address, port), timeout=timeout)
            except OSError as exc:
                problem = exc
        reason = problem.strerror or str(problem)
        raise SandboxError(f"nothing answers on port {port} in the sandbox ({reason})")

    def _pod_ip(self, sandbox: Sandbox, fresh: bool) -> str:
        key = (sandbox.pk, sandbox.reference)
        address = None if fresh else self._pod_ips.get(key)
        if address is None:
            try:
                pod = self.core.read_namespaced_pod(pod_name(sandbox), self.namespace)
            except ApiException as exc:
                raise SandboxError(f"cannot read the sandbox's pod: {_reason(exc)}") from exc
            address = pod.status.pod_ip if pod.status is not None else None
            if not address:
                raise SandboxError("the sandbox's pod has no address yet")
            self._pod_ips[key] = address
        return address

    # --- manifests ------------------------------------------------------------------------

    def labels(self, sandbox: Sandbox) -> dict[str, str]:
        return {**self._labels(sandbox.id), OWNER_LABEL: str(sandbox.owner_id)}

    @staticmethod
    def _labels(sandbox_id: UUID) -> dict[str, str]:
        """Return the labels of every resource of a sandbox (the owner's comes at claim)."""
        return {
            **SANDBOX_LABEL,
            "app.kubernetes.io/managed-by": "craft",
            SANDBOX_ID_LABEL: str(sandbox_id),
        }

    def warm_labels(self, sandbox_id: UUID) -> dict[str, str]:
        return {**self._labels(sandbox_id), WARM_LABEL: "true"}

    def pod_manifest(self, sandbox: Sandbox) -> dict[str, Any]:
        return self._pod_manifest(sandbox.id, self.labels(sandbox))

    def _pod_manifest(self, sandbox_id: UUID, labels: dict[str, str]) -> dict[str, Any]:
        """Return the pod: non-root, no capabilities, bounded resources, its files on the
        sandbox's claim (workspaces, home, git stores: one folder of it each)."""
        locked = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": _pod_name(sandbox_id), "labels": labels},
            "spec": {
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "restartPolicy": "Always",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": settings.CRAFT_K8S_RUN_AS_USER,
                    "runAsGroup": settings.CRAFT_K8S_RUN_AS_USER,
                    "fsGroup": settings.CRAFT_K8S_RUN_AS_USER,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "initContainers": [
                    {
                        "name": "data",
                        "image": settings.CRAFT_K8S_IMAGE,
                        "imagePullPolicy": settings.CRAFT_K8S_IMAGE_PULL_POLICY,
                        "command": ["sh", "-c", MAKE_DATA_FOLDERS, "sh", DATA_MOUNT],
                        "securityContext": locked,
                        "resources": GIT_RESOURCES,
                        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": DATA_MOUNT}],
                    }
                ],
                "containers": [
                    {
                        "name": CONTAINER,
                        "image": settings.CRAFT_K8S_IMAGE,
                        "imagePullPolicy": settings.CRAFT_K8S_IMAGE_PULL_POLICY,
                        "workingDir": WORKSPACE,
                        "securityContext": locked,
                        "resources": {
                            "requests": {
                                "cpu": settings.CRAFT_K8S_CPU_REQUEST,
                                "memory": settings.CRAFT_K8S_MEMORY_REQUEST,
                            },
                            "limits": {
                                "cpu": settings.CRAFT_K8S_CPU_LIMIT,
                                "memory": settings.CRAFT_K8S_MEMORY_LIMIT,
                            },
                        },
                        "volumeMounts": [
                            self._data_mount(WORKSPACE, WORKSPACE_SUBPATH),
                            self._data_mount(HOME, HOME_SUBPATH),
                            {"name": "credentials", "mountPath": CREDENTIALS, "readOnly": True},
                            self._data_mount(GIT_STORES, GIT_SUBPATH, read_only=True),
                        ],
                    },
                    {
                        # Craft's git, apart from the agent's processes (containers of a pod
                        # share no process namespace by default): the one place a token goes.
                        "name": GIT_CONTAINER,
                        "image": settings.CRAFT_K8S_IMAGE,
                        "imagePullPolicy": settings.CRAFT_K8S_IMAGE_PULL_POLICY,
                        "workingDir": WORKSPACE,
                        "securityContext": locked,
                        "resources": GIT_RESOURCES,
                        "volumeMounts": [
                            self._data_mount(WORKSPACE, WORKSPACE_SUBPATH),
                            self._data_mount(GIT_STORES, GIT_SUBPATH),
                        ],
                    },
                ],
                "volumes": [
                    {
                        "name": DATA_VOLUME,
                        "persistentVolumeClaim": {"claimName": _pod_name(sandbox_id)},
                    },
                    {
                        # Its owner's credentials, for its agents (docs/agents.md): readable
                        # by the pod's user (fsGroup) only.
                        "name": "credentials",
                        "secret": {
                            "secretName": _secret_name(sandbox_id),
                            "optional": True,
                            "defaultMode": 0o440,
                        },
                    },
                ],
            },
        }

    @staticmethod
    def _data_mount(path: str, sub_path: str, read_only: bool = False) -> dict[str, Any]:
        mount: dict[str, Any] = {"name": DATA_VOLUME, "mountPath": path, "subPath": sub_path}
        if read_only:
            mount["readOnly"] = True
        return mount

    def claim_manifest(self, sandbox: Sandbox) -> dict[str, Any]:
        return self._claim_manifest(sandbox.id, self.labels(sandbox))

    def _claim_manifest(self, sandbox_id: UUID, labels: dict[str, str]) -> dict[str, Any]:
        """Return the sandbox's PersistentVolumeClaim: named and labelled like its pod, one
        node's at a time (the pod's), CRAFT_K8S_WORKSPACE_SIZE, of CRAFT_K8S_STORAGE_CLASS
        (none named: the cluster's default class)."""
        spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": settings.CRAFT_K8S_WORKSPACE_SIZE}},
        }
        if settings.CRAFT_K8S_STORAGE_CLASS:
            spec["storageClassName"] = settings.CRAFT_K8S_STORAGE_CLASS
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": _pod_name(sandbox_id), "labels": labels},
            "spec": spec,
        }

    def secret_manifest(self, sandbox: Sandbox, values: dict[str, str]) -> dict[str, Any]:
        """Return the sandbox's credentials Secret holding `values` (and their revisions)."""
        return self._secret_manifest(sandbox.id, self.labels(sandbox), values)

    def _secret_manifest(
        self, sandbox_id: UUID, labels: dict[str, str], values: dict[str, str]
    ) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": _secret_name(sandbox_id), "labels": labels},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
        }

    def network_policy_manifest(self) -> dict[str, Any]:
        """Return the NetworkPolicy of every sandbox pod in the namespace.

        No ingress (exec reaches a pod through the kubelet, not the pod network) but, with
        previews on, from Craft's own pods (`_preview_ingress`). Egress
        to the cluster's DNS, and to every address except CRAFT_K8S_EGRESS_BLOCKED: the private
        ranges where pods, services, nodes and the Kubernetes API live, and link-local cloud
        metadata. Agents may still reach the internet (their model providers).
        """
        blocked = [ipaddress.ip_network(cidr) for cidr in settings.CRAFT_K8S_EGRESS_BLOCKED]
        allowed = []
        for everything in (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")):
            excepted = [str(net) for net in blocked if net.version == everything.version]
            allowed.append({"ipBlock": {"cidr": str(everything), "except": excepted}})
        cluster_dns = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": NETWORK_POLICY,
                "labels": {"app.kubernetes.io/managed-by": "craft"},
            },
            "spec": {
                "podSelector": {"matchLabels": SANDBOX_LABEL},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": self._preview_ingress(),
                "egress": [
                    {
                        "to": [cluster_dns],
                        "ports": [
                            {"protocol": "UDP", "port": 53},
                            {"protocol": "TCP", "port": 53},
                        ],
                    },
                    {"to": allowed},
                    # Git hosts (or other services) in the blocked ranges, named by the operator.
                    *(
                        [
                            {
                                "to": [
                                    {"ipBlock": {"cidr": str(ipaddress.ip_network(cidr))}}
                                    for cidr in settings.CRAFT_K8S_EGRESS_ALLOWED
                                ]
                            }
                        ]
                        if settings.CRAFT_K8S_EGRESS_ALLOWED
                        else []
                    ),
                ],
            },
        }

    @staticmethod
    def _preview_ingress() -> list[dict[str, Any]]:
        """Return who may connect to sandbox pods: with previews on (CRAFT_PREVIEW_ORIGIN),
        Craft's own pods (their namespace, their label) and no one else; else no one."""
        if not settings.CRAFT_PREVIEW_ORIGIN:
            return []
        craft = {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": settings.CRAFT_K8S_SERVER_NAMESPACE}
            },
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "craft"}},
        }
        return [{"from": [craft]}]

    def service_manifest(self, sandbox: Sandbox) -> dict[str, Any]:
        """Return a headless Service: a stable DNS name for the sandbox (e.g. for previews)."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": pod_name(sandbox), "labels": self.labels(sandbox)},
            "spec": {
                "clusterIP": "None",
                "selector": {"craft.dev/sandbox": str(sandbox.id)},
                "ports": [{"name": "preview", "port": 8080, "targetPort": 8080}],
            },
        }


class KubernetesGitRunner:
    """Runs Craft's git for one session of a sandbox pod (`sandboxes.repository`)."""

    def __init__(self, backend: KubernetesBackend, sandbox: Sandbox, session_id: UUID) -> None:
        self._backend = backend
        self._sandbox = sandbox
        self.workspace = backend.workspace_path(sandbox, session_id)
        self.store = f"{GIT_STORES}/{session_id}"

    def run(self, place: str, args: list[str]) -> ExecByteStream:
        # The workspace's git (its untrusted .git) in the agent's container; the store's in
        # the git container.
        container = CONTAINER if place == "workspace" else GIT_CONTAINER
        return self._exec(container, [*settings.CRAFT_K8S_GIT_TOOL, *args], keep_stdin=True)

    def run_setup(self, argv: list[str]) -> ExecByteStream:
        timeout = str(int(settings.CRAFT_SETUP_TIMEOUT_SECONDS))
        return self._exec(CONTAINER, ["sh", "-c", SETUP, "sh", self.workspace, timeout, *argv])

    def remove_store(self) -> None:
        process = self._exec(GIT_CONTAINER, ["rm", "-rf", "--", self.store])
        process.finish(settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT + 30)

    def _exec(self, container: str, argv: list[str], keep_stdin: bool = False) -> ExecByteStream:
        backend = self._backend
        return ExecByteStream(
            backend._exec_api_client(),
            keep_stdin=keep_stdin,
            namespace=backend.namespace,
            pod=pod_name(self._sandbox),
            container=container,
            argv=argv,
            handshake_timeout=settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT,
            idle_timeout=settings.CRAFT_K8S_EXEC_IDLE_TIMEOUT,
        )


def pod_is_ready(pod: Any) -> bool:
    status = pod.status
    if status is None or status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def pod_failure(pod: Any) -> str:
    """Return why the pod will not become ready without help, or "" if it still may."""
    status = pod.status
    if status is None:
        return ""
    if status.phase in ("Failed", "Succeeded"):
        return f"pod {status.phase.lower()}: {status.message or status.reason or 'no reason given'}"
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return f"pod cannot be scheduled: {condition.message}"
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in FATAL_WAITING_REASONS:
            return f"{waiting.reason}: {waiting.message or container.image}"
    return ""


def _reason(exc: ApiException) -> str:
    """Return the message of a Kubernetes Status error, or the HTTP reason."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return f"{body['message']} ({exc.status})"
    return f"{exc.reason} ({exc.status})"
