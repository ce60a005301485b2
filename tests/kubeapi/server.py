"""A small Kubernetes API server for tests, speaking the real wire protocols over loopback HTTP.

The official `kubernetes` Python client talks to it exactly as it talks to a cluster: JSON REST
for pods, services, events and discovery, and the websocket exec protocol (`v5.channel.k8s.io`,
`v4.channel.k8s.io`, `channel.k8s.io`) for `pods/exec`. An exec runs the requested argv as a
*local* subprocess whose `/workspace` is a folder under the server's root, so a sandbox backend
can be tested end to end without a cluster.

What is modelled:

* Pods: create / get / list / delete / watch, label and field selectors, a status that moves
  from Pending to Running and Ready as time passes (computed lazily on every read, so there are
  no timers), the events a kubelet and scheduler would record, and fault switches for image
  pull failures, unschedulable pods, pods that never become Ready and slow deletion.
* Services: create / get / list / delete / watch, with a cluster IP assigned on creation.
* Events: list and watch, with field selectors such as `involvedObject.name=x`.
* NetworkPolicies (`networking.k8s.io/v1`): create and get, stored as sent. Nothing enforces
  them: exec'd commands reach whatever this machine reaches.
* Errors: every failure is a `Status` object with the code and reason a real server uses.
* Exec: subprotocol negotiation, the empty priming frame, stdout/stderr streaming in frames of
  bounded size, stdin (text or binary frames), the v5 CLOSE signal that half-closes stdin, the
  status JSON on channel 3 when the command ends, and killing the process group when the client
  goes away.

What is NOT modelled (say it plainly so nobody relies on it):

* No authentication or authorization: any bearer token, or none, is accepted.
* No real scheduling, nodes, container runtime, images, probes or restarts; there is one fake
  node and the pod's "container" is whatever the exec runs on this machine, unconfined.
* Namespaces exist implicitly; there is no namespace lifecycle and no namespace deletion.
* No PATCH/PUT, no `pods/status`, no `pods/attach`, `pods/portforward` or `pods/proxy`; the pod
  log endpoint answers with an empty log.
* `resourceVersion` is a global counter: there is no optimistic concurrency, and watch can only
  resume approximately (objects newer than the given version are replayed as ADDED).
* Watches poll the in-memory state, so a change that is undone within ~50 ms can be missed.
* Set-based label selectors (`in`, `notin`) are rejected with 400.
* No TTY: `tty=true` merges stderr into stdout but no terminal is allocated and resize frames
  are ignored. The base64 exec subprotocols are not offered.
* Only argv elements that are `/workspace` or start with `/workspace/`, and JSON strings in
  stdin that start with `/workspace` (how an ACP agent learns its `cwd`; `map_stdin_paths`),
  are mapped to the pod's folder; paths inside a shell script (`sh -c "cd /workspace"`), in
  environment variables or glued to an option (`--dir=/workspace`) are passed through.
* The workspace folder outlives the pod, like a persistent volume mounted at `/workspace`.
* When the exec client goes away, the command's process group is killed at once; a real
  kubelet may leave the command running. Background processes that a finished command left
  behind keep running, as in a container, until the pod is deleted or the server stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import WSMsgType, web

NODE_NAME = "kube-test-node"
NODE_IP = "192.168.49.2"
GIT_VERSION = "v1.31.0"

# Websocket subprotocols of `pods/exec`.
V5_PROTOCOL = "v5.channel.k8s.io"  # v4 plus the CLOSE signal (channel 255)
V4_PROTOCOL = "v4.channel.k8s.io"  # exit status as a JSON Status on channel 3
V1_PROTOCOL = "channel.k8s.io"  # the oldest: channel 3 carries a plain error message

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255

# The python client sends stdin as one websocket message, so messages of many megabytes
# must be accepted (aiohttp's default limit is 4 MiB).
MAX_EXEC_MESSAGE = 256 * 1024 * 1024
WATCH_POLL_SECONDS = 0.05


# --------------------------------------------------------------------------------------------
# Status objects and errors
# --------------------------------------------------------------------------------------------


class ApiError(Exception):
    """A failure that the server answers with a `Status` object."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    def response(self) -> web.Response:
        return web.json_response(self.status(), status=self.code)


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
    )


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{resource} "{name}" already exists',
        {"name": name, "kind": resource},
    )


def invalid(kind: str, name: str, field_path: str, cause: str, detail: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {field_path}: {detail}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": cause, "message": detail, "field": field_path}],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def internal_error(cause: str) -> ApiError:
    return ApiError(
        500, "InternalError", f"Internal error occurred: {cause}", {"causes": [{"message": cause}]}
    )


def forbidden(resource: str, subresource: str, name: str, namespace: str) -> ApiError:
    message = (
        f'{resource} "{name}" is forbidden: User "system:anonymous" cannot create resource '
        f'"{resource}/{subresource}" in API group "" in the namespace "{namespace}"'
    )
    return ApiError(403, "Forbidden", message, {"name": name, "kind": resource})


# --------------------------------------------------------------------------------------------
# Small helpers: time, booleans, names, selectors
# --------------------------------------------------------------------------------------------


def rfc3339(when: float | None = None) -> str:
    """Format a wall-clock time the way the API server does (seconds, UTC, `Z`)."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_go_bool(value: str) -> bool:
    """Parse a boolean the way Go's strconv.ParseBool does (the API server uses it)."""
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{value}": invalid syntax')


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_KEY = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

Term = tuple[str, str, str]  # (key, operator, value); operators: "=", "!=", "exists", "!exists"


def parse_selector(text: str, *, allow_existence: bool) -> list[Term]:
    """Parse an equality-based selector such as `app=web,tier!=db,canary,!legacy`."""
    if "(" in text:
        raise bad_request(f"unable to parse requirement: set-based selector not supported: {text}")
    terms: list[Term] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        for op in ("!=", "==", "="):
            if op in part:
                key, value = (s.strip() for s in part.split(op, 1))
                terms.append((key, "!=" if op == "!=" else "=", value))
                break
        else:
            negated = part.startswith("!")
            key = part[1:].strip() if negated else part
            if not allow_existence or not _LABEL_KEY.fullmatch(key):
                raise bad_request(f"unable to parse requirement: invalid selector term: {part!r}")
            terms.append((key, "!exists" if negated else "exists", ""))
    return terms


def labels_match(labels: dict[str, str], terms: list[Term]) -> bool:
    for key, op, value in terms:
        present = key in labels
        if op == "exists" and not present:
            return False
        if op == "!exists" and present:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and present and labels[key] == value:
            return False
    return True


def dotted(obj: dict[str, Any], path: str) -> str:
    """Read `a.b.c` out of nested dicts; missing fields read as "" like the API server's."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, dict):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def fields_match(obj: dict[str, Any], terms: list[Term]) -> bool:
    for key, op, value in terms:
        actual = dotted(obj, key)
        if op == "=" and actual != value:
            return False
        if op == "!=" and actual == value:
            return False
    return True


# --------------------------------------------------------------------------------------------
# The in-memory cluster
# --------------------------------------------------------------------------------------------

# Fault plans, fixed when a pod is created from the server's switches at that moment.
PLAN_NORMAL = "normal"
PLAN_NEVER_READY = "never-ready"
PLAN_IMAGE_PULL = "image-pull-backoff"
PLAN_UNSCHEDULABLE = "unschedulable"

# Each plan is a timeline of (multiple of ready_delay, step). A pod applies every step whose
# time has come whenever it is read, so its status only depends on its age.
TIMELINES: dict[str, list[tuple[float, str]]] = {
    PLAN_NORMAL: [(0, "scheduled"), (1, "running")],
    PLAN_NEVER_READY: [(0, "scheduled"), (1, "running_unready")],
    PLAN_IMAGE_PULL: [(0, "scheduled"), (1, "err_image_pull"), (2, "image_pull_backoff")],
    PLAN_UNSCHEDULABLE: [(0, "unschedulable")],
}

UNSCHEDULABLE_MESSAGE = (
    "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
    "1 No preemption victims found for incoming pod."
)

# Field selectors the real API server accepts for each resource (a subset of them).
POD_FIELDS = {
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
}
SERVICE_FIELDS = {"metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"}
EVENT_FIELDS = {
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}


@dataclass
class PodEntry:
    """A pod plus what the server needs to move it along its timeline."""

    obj: dict[str, Any]
    plan: str
    ready_delay: float
    created: float  # monotonic clock
    index: int  # for the pod IP 10.0.0.N
    applied: int = 0  # how many timeline steps have been applied
    gone_at: float | None = None  # monotonic time a deleted pod disappears

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.obj["metadata"]["namespace"]

    @property
    def containers(self) -> list[dict[str, Any]]:
        return self.obj["spec"]["containers"]


def _hex_id(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": rfc3339(),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


class Cluster:
    """Pods, services and events. Only ever touched from the server's event loop thread."""

    def __init__(self) -> None:
        self._rv = itertools.count(1)
        self.resource_version = "1"
        self._ips = itertools.count(1)
        self._service_ips = itertools.count(1)
        self.pods: dict[tuple[str, str], PodEntry] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.network_policies: dict[tuple[str, str], dict[str, Any]] = {}
        # Called with (namespace, pod) when a pod is deleted and when it is finally gone, so
        # the server can stop the pod's processes.
        self.on_pod_deleted: Callable[[str, str], None] = lambda namespace, name: None
        self.on_pod_removed: Callable[[str, str], None] = lambda namespace, name: None

    def next_rv(self) -> str:
        self.resource_version = str(next(self._rv))
        return self.resource_version

    def _new_metadata(self, namespace: str, metadata: dict[str, Any], name: str) -> dict[str, Any]:
        metadata = dict(metadata)
        metadata.update(
            name=name,
            namespace=namespace,
            uid=str(uuid.uuid4()),
            resourceVersion=self.next_rv(),
            creationTimestamp=rfc3339(),
        )
        return metadata

    # -- names --------------------------------------------------------------------------------

    @staticmethod
    def _resolve_name(kind: str, namespace: str, body: dict[str, Any]) -> str:
        metadata = body.get("metadata") or {}
        if metadata.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        name = metadata.get("name") or ""
        if not name and metadata.get("generateName"):
            name = metadata["generateName"] + uuid.uuid4().hex[:5]
        if not name:
            raise invalid(
                kind,
                "",
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            )
        pattern = _DNS_LABEL if kind == "Service" else _DNS_SUBDOMAIN
        if len(name) > (63 if kind == "Service" else 253) or not pattern.fullmatch(name):
            raise invalid(
                kind,
                name,
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 name must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character",
            )
        return name

    # -- pods ---------------------------------------------------------------------------------

    def create_pod(
        self, namespace: str, body: dict[str, Any], *, plan: str, ready_delay: float
    ) -> PodEntry:
        self.sweep()
        name = self._resolve_name("Pod", namespace, body)
        if (namespace, name) in self.pods:
            raise already_exists("pods", name)
        spec = dict(body.get("spec") or {})
        containers = spec.get("containers") or []
        if not containers:
            raise invalid("Pod", name, "spec.containers", "FieldValueRequired", "Required value")
        for position, container in enumerate(containers):
            if not container.get("name") or not container.get("image"):
                missing = "name" if not container.get("name") else "image"
                raise invalid(
                    "Pod",
                    name,
                    f"spec.containers[{position}].{missing}",
                    "FieldValueRequired",
                    "Required value",
                )
        spec["containers"] = [self._default_container(c) for c in containers]
        for key, default in (
            ("restartPolicy", "Always"),
            ("terminationGracePeriodSeconds", 30),
            ("dnsPolicy", "ClusterFirst"),
            ("schedulerName", "default-scheduler"),
            ("serviceAccountName", "default"),
            ("serviceAccount", "default"),
            ("securityContext", {}),
            ("enableServiceLinks", True),
            ("preemptionPolicy", "PreemptLowerPriority"),
            ("priority", 0),
        ):
            spec.setdefault(key, default)
        obj = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": self._new_metadata(namespace, body.get("metadata") or {}, name),
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": self._qos_class(spec["containers"])},
        }
        entry = PodEntry(
            obj=obj,
            plan=plan,
            ready_delay=max(0.0, ready_delay),
            created=time.monotonic(),
            index=next(self._ips),
        )
        self.pods[(namespace, name)] = entry
        self._advance(entry, time.monotonic())
        return entry

    @staticmethod
    def _default_container(container: dict[str, Any]) -> dict[str, Any]:
        container = dict(container)
        image = container["image"]
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        return container

    @staticmethod
    def _qos_class(containers: list[dict[str, Any]]) -> str:
        resources = [c.get("resources") or {} for c in containers]
        if not any(r.get("requests") or r.get("limits") for r in resources):
            return "BestEffort"
        guaranteed = all(
            r.get("limits")
            and all(k in r["limits"] for k in ("cpu", "memory"))
            and (r.get("requests") or r["limits"]) == r["limits"]
            for r in resources
        )
        return "Guaranteed" if guaranteed else "Burstable"

    def get_pod(self, namespace: str, name: str) -> PodEntry:
        self.sweep()
        entry = self.pods.get((namespace, name))
        if entry is None:
            raise not_found("pods", name)
        return entry

    def list_pods(self, namespace: str | None) -> list[PodEntry]:
        self.sweep()
        return [e for (ns, _), e in sorted(self.pods.items()) if namespace in (None, ns)]

    def delete_pod(self, namespace: str, name: str, delay: float) -> PodEntry:
        entry = self.get_pod(namespace, name)
        metadata = entry.obj["metadata"]
        if entry.gone_at is None:
            entry.gone_at = time.monotonic() + max(0.0, delay)
            grace = entry.obj["spec"].get("terminationGracePeriodSeconds", 30)
            metadata["deletionTimestamp"] = rfc3339(time.time() + grace)
            metadata["deletionGracePeriodSeconds"] = grace
            metadata["resourceVersion"] = self.next_rv()
            for container in entry.containers:
                self._record_event(
                    entry,
                    "Killing",
                    f"Stopping container {container['name']}",
                    container=container["name"],
                )
            self.on_pod_deleted(namespace, name)
        return entry

    def sweep(self) -> None:
        """Advance every pod along its timeline and drop deleted pods whose time has come."""
        now = time.monotonic()
        for key, entry in list(self.pods.items()):
            if entry.gone_at is not None and now >= entry.gone_at:
                del self.pods[key]
                self.next_rv()
                # A pod that lingered may have gained execs since it was deleted.
                self.on_pod_removed(*key)
            else:
                self._advance(entry, now)

    def _advance(self, entry: PodEntry, now: float) -> None:
        timeline = TIMELINES[entry.plan]
        elapsed = now - entry.created
        while entry.applied < len(timeline):
            factor, step = timeline[entry.applied]
            if elapsed < factor * entry.ready_delay:
                break
            getattr(self, f"_step_{step}")(entry)
            entry.applied += 1
            entry.obj["metadata"]["resourceVersion"] = self.next_rv()

    # -- pod timeline steps ---------------------------------------------------------------------

    def _step_scheduled(self, entry: PodEntry) -> None:
        spec, status = entry.obj["spec"], entry.obj["status"]
        spec["nodeName"] = NODE_NAME
        status.update(
            phase="Pending",
            hostIP=NODE_IP,
            hostIPs=[{"ip": NODE_IP}],
            startTime=rfc3339(),
            conditions=[
                _condition("PodReadyToStartContainers", False),
                _condition("Initialized", True),
                _condition("Ready", False, "ContainersNotReady", self._unready_message(entry)),
                _condition(
                    "ContainersReady", False, "ContainersNotReady", self._unready_message(entry)
                ),
                _condition("PodScheduled", True),
            ],
            containerStatuses=[
                self._container_status(c, waiting=("ContainerCreating", ""))
                for c in entry.containers
            ],
        )
        self._record_event(
            entry,
            "Scheduled",
            f"Successfully assigned {entry.namespace}/{entry.name} to {NODE_NAME}",
            component="default-scheduler",
        )
        for container in entry.containers:
            self._record_event(
                entry,
                "Pulling",
                f'Pulling image "{container["image"]}"',
                container=container["name"],
            )

    def _step_running(self, entry: PodEntry, ready: bool = True) -> None:
        status = entry.obj["status"]
        pod_ip = f"10.0.0.{entry.index}"
        unready = "" if ready else self._unready_message(entry)
        status.update(
            phase="Running",
            podIP=pod_ip,
            podIPs=[{"ip": pod_ip}],
            conditions=[
                _condition("PodReadyToStartContainers", True),
                _condition("Initialized", True),
                _condition("Ready", ready, "" if ready else "ContainersNotReady", unready),
                _condition(
                    "ContainersReady", ready, "" if ready else "ContainersNotReady", unready
                ),
                _condition("PodScheduled", True),
            ],
            containerStatuses=[
                self._container_status(c, running=True, ready=ready) for c in entry.containers
            ],
        )
        for container in entry.containers:
            name, image = container["name"], container["image"]
            self._record_event(
                entry,
                "Pulled",
                f'Successfully pulled image "{image}" in 1.2s (1.2s including waiting). '
                "Image size: 4269694 bytes.",
                container=name,
            )
            self._record_event(entry, "Created", f"Created container {name}", container=name)
            self._record_event(entry, "Started", f"Started container {name}", container=name)
            if not ready:
                self._record_event(
                    entry,
                    "Unhealthy",
                    "Readiness probe failed: container is not ready",
                    container=name,
                    warning=True,
                )

    def _step_running_unready(self, entry: PodEntry) -> None:
        self._step_running(entry, ready=False)

    def _step_err_image_pull(self, entry: PodEntry) -> None:
        self._image_failure(entry, backoff=False)

    def _step_image_pull_backoff(self, entry: PodEntry) -> None:
        self._image_failure(entry, backoff=True)

    def _image_failure(self, entry: PodEntry, *, backoff: bool) -> None:
        # The sandbox exists before images are pulled, so the pod already has an IP.
        status = entry.obj["status"]
        pod_ip = f"10.0.0.{entry.index}"
        status.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
        status["conditions"][0] = _condition("PodReadyToStartContainers", True)
        statuses = []
        for container in entry.containers:
            name, image = container["name"], container["image"]
            pull_error = (
                f'failed to pull and unpack image "{image}": failed to resolve reference '
                f'"{image}": {image}: not found'
            )
            if backoff:
                waiting = (
                    "ImagePullBackOff",
                    f'Back-off pulling image "{image}": ErrImagePull: {pull_error}',
                )
                self._record_event(
                    entry, "BackOff", f'Back-off pulling image "{image}"', container=name
                )
                self._record_event(
                    entry, "Failed", "Error: ImagePullBackOff", container=name, warning=True
                )
            else:
                waiting = ("ErrImagePull", pull_error)
                self._record_event(
                    entry,
                    "Failed",
                    f'Failed to pull image "{image}": {pull_error}',
                    container=name,
                    warning=True,
                )
                self._record_event(
                    entry, "Failed", "Error: ErrImagePull", container=name, warning=True
                )
            statuses.append(self._container_status(container, waiting=waiting))
        status["containerStatuses"] = statuses

    def _step_unschedulable(self, entry: PodEntry) -> None:
        entry.obj["status"].update(
            phase="Pending",
            conditions=[_condition("PodScheduled", False, "Unschedulable", UNSCHEDULABLE_MESSAGE)],
        )
        self._record_event(
            entry,
            "FailedScheduling",
            UNSCHEDULABLE_MESSAGE,
            component="default-scheduler",
            warning=True,
        )

    @staticmethod
    def _unready_message(entry: PodEntry) -> str:
        names = " ".join(c["name"] for c in entry.containers)
        return f"containers with unready status: [{names}]"

    def _container_status(
        self,
        container: dict[str, Any],
        *,
        waiting: tuple[str, str] | None = None,
        running: bool = False,
        ready: bool = False,
    ) -> dict[str, Any]:
        image = container["image"]
        status: dict[str, Any] = {
            "name": container["name"],
            "image": image,
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": running,
            "lastState": {},
        }
        if running:
            status["imageID"] = f"{image.split(':')[0]}@sha256:{_hex_id('image', image)}"
            status["containerID"] = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
            status["state"] = {"running": {"startedAt": rfc3339()}}
        else:
            reason, message = waiting or ("ContainerCreating", "")
            status["state"] = {
                "waiting": {"reason": reason, **({"message": message} if message else {})}
            }
        return status

    # -- events -------------------------------------------------------------------------------

    def _record_event(
        self,
        entry: PodEntry,
        reason: str,
        message: str,
        *,
        container: str | None = None,
        component: str = "kubelet",
        warning: bool = False,
    ) -> None:
        metadata = entry.obj["metadata"]
        involved: dict[str, Any] = {
            "kind": "Pod",
            "namespace": entry.namespace,
            "name": entry.name,
            "uid": metadata["uid"],
            "apiVersion": "v1",
            "resourceVersion": metadata["resourceVersion"],
        }
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        now = rfc3339()
        # Like the kubelet's recorder: pod name plus the time in hex nanoseconds, so listing
        # (sorted by name, as etcd returns it) gives a pod's events in order.
        stamp = time.time_ns()
        while (entry.namespace, f"{entry.name}.{stamp:x}") in self.events:
            stamp += 1
        name = f"{entry.name}.{stamp:x}"
        self.events[(entry.namespace, name)] = {
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": entry.namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": self.next_rv(),
                "creationTimestamp": now,
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "source": {"component": component}
            | ({"host": NODE_NAME} if component == "kubelet" else {}),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": "Warning" if warning else "Normal",
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": NODE_NAME if component == "kubelet" else "",
        }

    def list_events(self, namespace: str | None) -> list[dict[str, Any]]:
        self.sweep()  # events appear as pods move along
        return [e for (ns, _), e in sorted(self.events.items()) if namespace in (None, ns)]

    # -- services -----------------------------------------------------------------------------

    def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = self._resolve_name("Service", namespace, body)
        if (namespace, name) in self.services:
            raise already_exists("services", name)
        spec = dict(body.get("spec") or {})
        spec.setdefault("type", "ClusterIP")
        if not spec.get("clusterIP"):
            spec["clusterIP"] = f"10.96.0.{next(self._service_ips)}"
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec["ports"] = [
            {"protocol": "TCP", "targetPort": port.get("port"), **port}
            for port in spec.get("ports") or []
        ]
        service = {
            "kind": "Service",
            "apiVersion": "v1",
            "metadata": self._new_metadata(namespace, body.get("metadata") or {}, name),
            "spec": spec,
            "status": {"loadBalancer": {}},
        }
        self.services[(namespace, name)] = service
        return service

    def get_service(self, namespace: str, name: str) -> dict[str, Any]:
        service = self.services.get((namespace, name))
        if service is None:
            raise not_found("services", name)
        return service

    def delete_service(self, namespace: str, name: str) -> dict[str, Any]:
        service = self.get_service(namespace, name)
        del self.services[(namespace, name)]
        self.next_rv()
        return service

    def list_services(self, namespace: str | None) -> list[dict[str, Any]]:
        return [s for (ns, _), s in sorted(self.services.items()) if namespace in (None, ns)]

    # -- network policies (stored, not enforced) -----------------------------------------------

    def create_network_policy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = self._resolve_name("NetworkPolicy", namespace, body)
        if (namespace, name) in self.network_policies:
            raise already_exists("networkpolicies.networking.k8s.io", name)
        policy = {
            "kind": "NetworkPolicy",
            "apiVersion": "networking.k8s.io/v1",
            "metadata": self._new_metadata(namespace, body.get("metadata") or {}, name),
            "spec": body.get("spec") or {},
        }
        self.network_policies[(namespace, name)] = policy
        return policy

    def get_network_policy(self, namespace: str, name: str) -> dict[str, Any]:
        policy = self.network_policies.get((namespace, name))
        if policy is None:
            raise not_found("networkpolicies.networking.k8s.io", name)
        return policy

    def namespaces(self) -> list[str]:
        seen = {"default", "kube-system", "kube-public", "kube-node-lease"}
        for table in (self.pods, self.services, self.events):
            seen.update(ns for ns, _ in table)
        return sorted(seen)


# --------------------------------------------------------------------------------------------
# Exec
# --------------------------------------------------------------------------------------------


@dataclass
class ExecRecord:
    """One exec, as seen by the server. Times are wall-clock `time.time()` values.

    `returncode` is None while the command runs, then the subprocess's return code as Python
    reports it (negative for a signal, e.g. -9 when the server killed it). A command that could
    not be started gets 127 (not found) or 126 (not executable), and `error` says why.
    """

    namespace: str
    pod: str
    container: str
    argv: list[str]
    protocol: str  # negotiated subprotocol; "" when the client offered none
    pid: int | None = None
    returncode: int | None = None
    stdin_closed: bool = False
    error: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None


@dataclass
class ExecOptions:
    command: list[str]
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def negotiate_subprotocol(header: str | None) -> str:
    """Pick the exec subprotocol the way a real cluster does.

    Since Kubernetes 1.30 the API server hands every websocket exec that offers v5 anywhere in
    its list to its stream translator, which speaks only v5; so v5 wins whenever it is offered.
    Any other request is proxied to the kubelet, whose handshake takes the first protocol in the
    client's order that it knows. A client that offers nothing gets the unnamed protocol ""
    (no Sec-WebSocket-Protocol in the answer), which behaves like `channel.k8s.io`: binary
    channels, and channel 3 carries a plain error message instead of a Status.
    """
    offered = [p.strip() for p in (header or "").split(",") if p.strip()]
    if V5_PROTOCOL in offered:
        return V5_PROTOCOL
    if not offered:
        return ""
    for protocol in offered:
        if protocol in (V4_PROTOCOL, V1_PROTOCOL):
            return protocol
    raise bad_request(
        f"requested protocol(s) are not supported: [{' '.join(offered)}]; supports "
        f"[{V5_PROTOCOL} {V4_PROTOCOL} {V1_PROTOCOL}]"
    )


def parse_exec_options(query: Any, entry: PodEntry) -> ExecOptions:
    """Read PodExecOptions from the query string, validating like the API server."""

    def flag(name: str, default: bool) -> bool:
        values = query.getall(name, [])
        if not values:
            return default
        try:
            return parse_go_bool(values[-1])
        except ValueError as exc:
            raise bad_request(str(exc)) from None

    # The API server defaults stdout and stderr to true; stdin and tty to false.
    options = ExecOptions(
        command=list(query.getall("command", [])),
        container=query.get("container", ""),
        stdin=flag("stdin", False),
        stdout=flag("stdout", True),
        stderr=flag("stderr", True),
        tty=flag("tty", False),
    )
    if not options.command:
        raise bad_request("you must specify at least one command for the container")
    if not (options.stdin or options.stdout or options.stderr):
        raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
    names = [c["name"] for c in entry.containers]
    if not options.container:
        default = (
            entry.obj["metadata"]
            .get("annotations", {})
            .get("kubectl.kubernetes.io/default-container")
        )
        if default in names:
            options.container = default
        elif len(names) == 1:
            options.container = names[0]
        else:
            raise bad_request(
                f"a container name must be specified for pod {entry.name}, choose one of: "
                f"[{' '.join(names)}]"
            )
    elif options.container not in names:
        raise bad_request(f"container {options.container} is not valid for pod {entry.name}")
    return options


def map_workspace(arg: str, workspace: Path) -> str:
    """Rewrite `/workspace` and `/workspace/...` to the pod's local folder."""
    if arg == "/workspace":
        return str(workspace)
    if arg.startswith("/workspace/"):
        return str(workspace) + arg[len("/workspace") :]
    return arg


def map_workspace_in_json(data: bytes, workspace: Path) -> bytes:
    """Rewrite JSON strings that start with `/workspace` to the pod's local folder.

    Agents learn their working directory over stdin (ACP `session/new` carries `cwd`). In a
    real pod `/workspace` exists; on this machine it does not, so the same mapping as for argv
    is applied to JSON string values in stdin. Each websocket message is rewritten on its
    own, which is enough for clients that send whole lines (the ACP client does).
    """
    local = json.dumps(str(workspace))[1:-1].encode()
    return data.replace(b'"/workspace/', b'"' + local + b"/").replace(
        b'"/workspace"', b'"' + local + b'"'
    )


def exit_status(argv: list[str], returncode: int) -> dict[str, Any]:
    """The Status the kubelet writes on channel 3 when the command ends."""
    if returncode == 0:
        return {"metadata": {}, "status": "Success"}
    # A process killed by a signal is reported like a shell would: 128 + signal.
    code = returncode if returncode > 0 else 128 - returncode
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(argv)}], exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def start_failure(argv0: str, exc: OSError, exec_id: str) -> tuple[ApiError, int]:
    """The InternalError containerd reports when the executable cannot be started."""
    if isinstance(exc, PermissionError):
        detail, code = f'exec: "{argv0}": permission denied', 126
    elif "/" in argv0:
        detail, code = f'exec: "{argv0}": stat {argv0}: no such file or directory', 127
    else:
        detail, code = f'exec: "{argv0}": executable file not found in $PATH', 127
    cause = (
        "error executing command in container: failed to exec in container: failed to start "
        f'exec "{exec_id}": OCI runtime exec failed: exec failed: unable to start container '
        f"process: {detail}: unknown"
    )
    return internal_error(cause), code


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL an exec's process group: the command and whatever it left running.

    The command leads its own session, so its pid is the group id. Once the command has been
    reaped that pid may be reused, so the group is then only signalled while no process holds
    the pid: in that case only our leftovers can still carry this group id.
    """
    if process.returncode is not None:
        try:
            os.kill(process.pid, 0)
        except ProcessLookupError:
            pass
        else:
            return  # the pid belongs to some other process now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class ExecSession:
    """One exec websocket: a subprocess wired to the channels of the negotiated protocol."""

    def __init__(
        self,
        server: KubeTestServer,
        ws: web.WebSocketResponse,
        record: ExecRecord,
        options: ExecOptions,
        workspace: Path,
        env: dict[str, str],
        cwd: Path,
    ) -> None:
        self.server = server
        self.ws = ws
        self.record = record
        self.options = options
        self.workspace = workspace
        self.env = env
        self.cwd = cwd
        self.process: asyncio.subprocess.Process | None = None

    async def run(self) -> None:
        # The kubelet writes an empty message on the lowest writable channel as soon as the
        # connection is up; clients use it to know the stream is established.
        options = self.options
        priming = STDOUT if options.stdout else STDERR if options.stderr else ERROR
        await self._send(priming, b"")
        try:
            self.process = await self._spawn()
        except OSError as exc:
            await self._fail_to_start(exc)
            return
        process = self.process
        self.record.pid = process.pid
        self.server._track_process(self.record, process)
        stdin_queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read_client(stdin_queue))
        helpers = [reader]
        if process.stdin is not None:
            helpers.append(asyncio.create_task(self._feed_stdin(process, stdin_queue)))
        pumps = [
            asyncio.create_task(self._pump(stream, channel))
            for stream, channel in ((process.stdout, STDOUT), (process.stderr, STDERR))
            if stream is not None
        ]
        finished = asyncio.create_task(self._wait_finished(process, pumps))
        helpers += [*pumps, finished]
        try:
            done, _ = await asyncio.wait({reader, finished}, return_when=asyncio.FIRST_COMPLETED)
            if finished in done:
                await self._send_status(exit_status(options.command, process.returncode or 0))
                await self.ws.close()
            else:
                kill_group(process)  # the client went away: nobody will read the output
            # Bounded, in case something that escaped the process group holds the pipes open.
            await asyncio.wait({finished}, timeout=5)
        finally:
            if process.returncode is None:
                kill_group(process)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if process.returncode is None:
                await process.wait()
            self._finish(process.returncode)

    async def _spawn(self) -> asyncio.subprocess.Process:
        options = self.options
        argv = [map_workspace(arg, self.workspace) for arg in options.command]
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        if options.tty and options.stdout:
            stderr = asyncio.subprocess.STDOUT  # a terminal has a single output stream
        else:
            stderr = pipe if options.stderr else devnull
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=pipe if options.stdin else devnull,
            stdout=pipe if options.stdout else devnull,
            stderr=stderr,
            cwd=self.cwd,
            env=self.env,
            start_new_session=True,
        )

    async def _fail_to_start(self, exc: OSError) -> None:
        exec_id = uuid.uuid4().hex + uuid.uuid4().hex
        error, code = start_failure(self.options.command[0], exc, exec_id)
        self.record.error = error.message
        self._finish(code)
        status = error.status()
        # The kubelet marshals the Status without kind/apiVersion.
        del status["kind"], status["apiVersion"]
        await self._send_status(status)
        await self.ws.close()

    def _finish(self, returncode: int | None) -> None:
        if self.record.ended is None:
            self.record.returncode = returncode
            self.record.ended = time.time()

    async def _wait_finished(
        self, process: asyncio.subprocess.Process, pumps: list[asyncio.Task[None]]
    ) -> None:
        # The exec ends once the process has exited AND its output is drained, like the
        # kubelet, which waits for the output copies to finish.
        await asyncio.gather(*pumps)
        await process.wait()
        self._finish(process.returncode)

    async def _read_client(self, stdin_queue: asyncio.Queue[bytes | None]) -> None:
        """Read client frames until the websocket closes. Frames may be TEXT or BINARY."""
        async for message in self.ws:
            if message.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                break  # ERROR: the connection is broken
            data: bytes = message.data
            if isinstance(data, str):  # defensive: decode_text=False gives bytes
                data = data.encode()
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDIN and self.options.stdin:
                stdin_queue.put_nowait(payload)
            elif (
                channel == CLOSE
                and self.record.protocol == V5_PROTOCOL
                and payload == bytes([STDIN])
                and not self.record.stdin_closed
            ):
                self.record.stdin_closed = True
                stdin_queue.put_nowait(None)
            # RESIZE and unknown channels are ignored, as the kubelet does without a TTY.

    async def _feed_stdin(
        self, process: asyncio.subprocess.Process, stdin_queue: asyncio.Queue[bytes | None]
    ) -> None:
        # A queue decouples reading the websocket from writing the pipe, so a client that
        # sends megabytes before reading its output cannot deadlock against the process.
        stdin = process.stdin
        assert stdin is not None
        try:
            while (chunk := await stdin_queue.get()) is not None:
                if self.server.map_stdin_paths:
                    chunk = map_workspace_in_json(chunk, self.workspace)
                stdin.write(chunk)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the process stopped reading; later input is dropped
        finally:
            with contextlib.suppress(Exception):
                stdin.close()

    async def _pump(self, stream: asyncio.StreamReader, channel: int) -> None:
        # read(n) returns whatever is available up to n bytes: output is not line-buffered
        # here, and a small frame size can split a multibyte character across frames.
        connected = True
        while chunk := await stream.read(max(1, int(self.server.exec_frame_size))):
            if connected:
                connected = await self._send(channel, chunk)

    async def _send(self, channel: int, payload: bytes) -> bool:
        try:
            await self.ws.send_bytes(bytes([channel]) + payload)
            return True
        except (ConnectionError, RuntimeError):
            return False

    async def _send_status(self, status: dict[str, Any]) -> None:
        if self.record.protocol in (V4_PROTOCOL, V5_PROTOCOL):
            await self._send(ERROR, json.dumps(status, separators=(",", ":")).encode())
        elif status.get("status") != "Success":
            # Older protocols only carry the error message, and nothing on success.
            await self._send(ERROR, status.get("message", "").encode())


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------

API_RESOURCES = [
    {
        "name": "events",
        "singularName": "event",
        "namespaced": True,
        "kind": "Event",
        "verbs": [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ],
        "shortNames": ["ev"],
    },
    {
        "name": "namespaces",
        "singularName": "namespace",
        "namespaced": False,
        "kind": "Namespace",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortNames": ["ns"],
    },
    {
        "name": "pods",
        "singularName": "pod",
        "namespaced": True,
        "kind": "Pod",
        "verbs": [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ],
        "shortNames": ["po"],
        "categories": ["all"],
    },
    {
        "name": "pods/exec",
        "singularName": "",
        "namespaced": True,
        "kind": "PodExecOptions",
        "verbs": ["create", "get"],
    },
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    {
        "name": "services",
        "singularName": "service",
        "namespaced": True,
        "kind": "Service",
        "verbs": [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ],
        "shortNames": ["svc"],
        "categories": ["all"],
    },
]


def _list_item(obj: dict[str, Any]) -> dict[str, Any]:
    # Items of a real list carry no kind/apiVersion of their own.
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


class KubeTestServer:
    """A Kubernetes API server on 127.0.0.1, running on its own thread and event loop.

    The knobs below are plain attributes that tests may set from their own thread at any time;
    the server thread reads them when it needs them. `ready_delay`, `never_ready`,
    `image_pull_backoff` and `unschedulable` are read when a pod is created and stay with that
    pod; `delete_delay` when it is deleted; the exec knobs on every exec (`exec_frame_size` on
    every read of the process output); `rest_failures` on every request.
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
        self.exec_handshake_delay = 0.0
        self.exec_refused = False
        self.exec_frame_size = 65536
        # Rewrite "/workspace..." JSON strings in exec stdin too (see map_workspace_in_json).
        self.map_stdin_paths = True
        self.delete_delay = 0.0
        # What happened, appended on the server thread.
        self.execs: list[ExecRecord] = []
        self.requests: list[tuple[str, str]] = []

        self.cluster = Cluster()
        self.cluster.on_pod_deleted = self._kill_pod_processes
        self.cluster.on_pod_removed = self._forget_pod_processes
        # Every exec process per pod, kept after the command ends: background processes it
        # left behind run on, as in a container, until the pod is deleted or the server stops.
        self._processes: dict[tuple[str, str], list[asyncio.subprocess.Process]] = {}
        self._streams: set[asyncio.Task[Any]] = set()  # exec and watch handlers
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
        """The local folder that is `/workspace` in that pod."""
        return self.root / namespace / pod_name

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
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def configuration(self) -> Any:
        """A `kubernetes.client.Configuration` pointing at this server."""
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
        streams = list(self._streams)
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    def _track_process(self, record: ExecRecord, process: asyncio.subprocess.Process) -> None:
        self._processes.setdefault((record.namespace, record.pod), []).append(process)

    def _kill_pod_processes(self, namespace: str, name: str) -> None:
        for process in self._processes.get((namespace, name), []):
            kill_group(process)

    def _forget_pod_processes(self, namespace: str, name: str) -> None:
        self._kill_pod_processes(namespace, name)
        self._processes.pop((namespace, name), None)

    # -- routing ------------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        ns = "/api/v1/namespaces/{namespace}"
        # The generated client asks for discovery paths with a trailing slash; kubectl without.
        for path, handler in (
            ("/version", self._version),
            ("/api", self._api_versions),
            ("/api/v1", self._api_resources),
            ("/apis", self._api_groups),
        ):
            app.router.add_get(path, handler)
            app.router.add_get(path + "/", handler)
        app.router.add_get("/api/v1/namespaces", self._list_namespaces)
        app.router.add_get(ns, self._get_namespace)
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_get(ns + "/pods", self._list_pods)
        app.router.add_post(ns + "/pods", self._create_pod)
        app.router.add_get(ns + "/pods/{name}", self._get_pod)
        app.router.add_delete(ns + "/pods/{name}", self._delete_pod)
        app.router.add_get(ns + "/pods/{name}/log", self._pod_log)
        app.router.add_get(ns + "/pods/{name}/exec", self._exec)
        app.router.add_post(ns + "/pods/{name}/exec", self._exec)
        app.router.add_get("/api/v1/services", self._list_services)
        app.router.add_get(ns + "/services", self._list_services)
        app.router.add_post(ns + "/services", self._create_service)
        app.router.add_get(ns + "/services/{name}", self._get_service)
        app.router.add_delete(ns + "/services/{name}", self._delete_service)
        app.router.add_get("/api/v1/events", self._list_events)
        app.router.add_get(ns + "/events", self._list_events)
        policies = "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
        app.router.add_post(policies, self._create_network_policy)
        app.router.add_get(policies + "/{name}", self._get_network_policy)

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
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

    # -- discovery ----------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.Response:
        major, minor, _ = GIT_VERSION.lstrip("v").split(".")
        return web.json_response(
            {
                "major": major,
                "minor": minor,
                "gitVersion": GIT_VERSION,
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.22.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _api_versions(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
        )

    async def _api_resources(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "APIResourceList", "groupVersion": "v1", "resources": API_RESOURCES}
        )

    async def _api_groups(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    # -- namespaces ---------------------------------------------------------------------------

    @staticmethod
    def _namespace_object(name: str) -> dict[str, Any]:
        return {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": str(uuid.UUID(_hex_id("namespace", name)[:32])),
                "resourceVersion": "1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    async def _get_namespace(self, request: web.Request) -> web.Response:
        return web.json_response(self._namespace_object(request.match_info["namespace"]))

    async def _list_namespaces(self, request: web.Request) -> web.Response:
        items = [self._namespace_object(name) for name in self.cluster.namespaces()]
        return self._list_response("NamespaceList", items, request, set())

    # -- lists and watches ------------------------------------------------------------------

    def _filter(
        self, request: web.Request, items: Iterable[dict[str, Any]], supported: set[str]
    ) -> list[dict[str, Any]]:
        labels = parse_selector(request.query.get("labelSelector", ""), allow_existence=True)
        fields = parse_selector(request.query.get("fieldSelector", ""), allow_existence=False)
        for key, _, _ in fields:
            if key not in supported:
                raise bad_request(f"field label not supported: {key}")
        return [
            item
            for item in items
            if labels_match(item["metadata"].get("labels") or {}, labels)
            and fields_match(item, fields)
        ]

    def _list_response(
        self,
        kind: str,
        items: Iterable[dict[str, Any]],
        request: web.Request,
        supported: set[str],
    ) -> web.Response:
        selected = self._filter(request, items, supported)
        return web.json_response(
            {
                "kind": kind,
                "apiVersion": "v1",
                "metadata": {"resourceVersion": self.cluster.resource_version},
                "items": [_list_item(item) for item in selected],
            }
        )

    async def _list_or_watch(
        self,
        request: web.Request,
        kind: str,
        snapshot: Callable[[], list[dict[str, Any]]],
        supported: set[str],
    ) -> web.StreamResponse:
        watch = request.query.get("watch", "")
        try:
            watching = bool(watch) and parse_go_bool(watch)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        if not watching:
            return self._list_response(kind, snapshot(), request, supported)
        return await self._watch(request, lambda: self._filter(request, snapshot(), supported))

    async def _watch(
        self, request: web.Request, snapshot: Callable[[], list[dict[str, Any]]]
    ) -> web.StreamResponse:
        """Stream watch events by polling the in-memory state for changes."""
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            timeout = float(request.query.get("timeoutSeconds") or 0)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        since_text = request.query.get("resourceVersion", "")
        since = int(since_text) if since_text.isdigit() and since_text != "0" else None
        initial = snapshot()  # before answering, so a bad selector still gets a 400
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        deadline = time.monotonic() + timeout if timeout > 0 else None

        def key(obj: dict[str, Any]) -> str:
            return obj["metadata"]["uid"]

        async def send(kind: str, obj: dict[str, Any]) -> None:
            line = json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n"
            await response.write(line.encode())

        try:
            seen: dict[str, dict[str, Any]] = {}
            for obj in initial:
                if since is None or int(obj["metadata"]["resourceVersion"]) > since:
                    await send("ADDED", obj)
                seen[key(obj)] = json.loads(json.dumps(obj))
            while deadline is None or time.monotonic() < deadline:
                await asyncio.sleep(WATCH_POLL_SECONDS)
                current = {key(obj): obj for obj in snapshot()}
                for uid, obj in current.items():
                    previous = seen.get(uid)
                    if previous is None:
                        await send("ADDED", obj)
                    elif (
                        previous["metadata"]["resourceVersion"]
                        != obj["metadata"]["resourceVersion"]
                    ):
                        await send("MODIFIED", obj)
                for uid in seen.keys() - current.keys():
                    await send("DELETED", seen[uid])
                # Copies, because the stored objects are changed in place.
                seen = {uid: json.loads(json.dumps(obj)) for uid, obj in current.items()}
            await response.write_eof()
        except ConnectionError:
            pass  # the client stopped watching
        finally:
            self._streams.discard(task)
        return response

    # -- pods ---------------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_request(f"the body of the request was in an unknown format: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        return body

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
        body = await self._read_body(request)
        entry = self.cluster.create_pod(
            namespace, body, plan=self._pod_plan(), ready_delay=float(self.ready_delay)
        )
        self.workspace(namespace, entry.name).mkdir(parents=True, exist_ok=True)
        return web.json_response(entry.obj, status=201)

    async def _get_pod(self, request: web.Request) -> web.Response:
        entry = self.cluster.get_pod(request.match_info["namespace"], request.match_info["name"])
        return web.json_response(entry.obj)

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace")
        return await self._list_or_watch(
            request,
            "PodList",
            lambda: [entry.obj for entry in self.cluster.list_pods(namespace)],
            POD_FIELDS,
        )

    async def _delete_pod(self, request: web.Request) -> web.Response:
        # DeleteOptions (propagationPolicy, gracePeriodSeconds, ...) are accepted and ignored.
        entry = self.cluster.delete_pod(
            request.match_info["namespace"], request.match_info["name"], float(self.delete_delay)
        )
        return web.json_response(entry.obj)

    async def _pod_log(self, request: web.Request) -> web.Response:
        self.cluster.get_pod(request.match_info["namespace"], request.match_info["name"])
        return web.Response(text="", content_type="text/plain")

    # -- services -----------------------------------------------------------------------------

    async def _create_service(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        service = self.cluster.create_service(request.match_info["namespace"], body)
        return web.json_response(service, status=201)

    async def _get_service(self, request: web.Request) -> web.Response:
        return web.json_response(
            self.cluster.get_service(request.match_info["namespace"], request.match_info["name"])
        )

    async def _list_services(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace")
        return await self._list_or_watch(
            request, "ServiceList", lambda: self.cluster.list_services(namespace), SERVICE_FIELDS
        )

    async def _delete_service(self, request: web.Request) -> web.Response:
        # Since Kubernetes 1.23 deleting a service returns the deleted Service (the generated
        # client types the answer as V1Service), not a Status.
        service = self.cluster.delete_service(
            request.match_info["namespace"], request.match_info["name"]
        )
        return web.json_response(service)

    # -- network policies -----------------------------------------------------------------------

    async def _create_network_policy(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        policy = self.cluster.create_network_policy(request.match_info["namespace"], body)
        return web.json_response(policy, status=201)

    async def _get_network_policy(self, request: web.Request) -> web.Response:
        return web.json_response(
            self.cluster.get_network_policy(
                request.match_info["namespace"], request.match_info["name"]
            )
        )

    # -- events -------------------------------------------------------------------------------

    async def _list_events(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace")
        return await self._list_or_watch(
            request, "EventList", lambda: self.cluster.list_events(namespace), EVENT_FIELDS
        )

    # -- exec ---------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        if self.exec_handshake_delay > 0:
            await asyncio.sleep(float(self.exec_handshake_delay))
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        # Authorization comes before anything else in a real API server.
        if self.exec_refused:
            raise forbidden("pods", "exec", name, namespace)
        entry = self.cluster.get_pod(namespace, name)
        options = parse_exec_options(request.query, entry)
        self._require_running(entry, options.container)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise bad_request("Upgrade request required")
        protocol = negotiate_subprotocol(request.headers.get("Sec-WebSocket-Protocol"))
        ws = web.WebSocketResponse(
            protocols=(protocol,) if protocol else (),
            max_msg_size=MAX_EXEC_MESSAGE,
            compress=False,
            decode_text=False,
        )
        await ws.prepare(request)
        record = ExecRecord(
            namespace=namespace,
            pod=name,
            container=options.container,
            argv=list(options.command),
            protocol=protocol,
        )
        self.execs.append(record)
        workspace = self.workspace(namespace, name)
        container = next(c for c in entry.containers if c["name"] == options.container)
        session = ExecSession(
            self,
            ws,
            record,
            options,
            workspace,
            self._exec_environment(entry, container, workspace),
            self._exec_cwd(container, workspace),
        )
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            await session.run()
        finally:
            self._streams.discard(task)
        return ws

    @staticmethod
    def _require_running(entry: PodEntry, container: str) -> None:
        if entry.obj["status"].get("phase") == "Running":
            return
        if not entry.obj["spec"].get("nodeName"):
            raise bad_request(f"pod {entry.name} does not have a host assigned")
        raise bad_request(f'pod {entry.name} is not running: container not found ("{container}")')

    @staticmethod
    def _exec_environment(
        entry: PodEntry, container: dict[str, Any], workspace: Path
    ) -> dict[str, str]:
        env = dict(os.environ)
        env["HOSTNAME"] = entry.name
        for variable in container.get("env") or []:
            if "value" in variable:  # valueFrom (secrets, field refs) is not modelled
                env[variable["name"]] = str(variable["value"])
        env["HOME"] = str(workspace)
        return env

    @staticmethod
    def _exec_cwd(container: dict[str, Any], workspace: Path) -> Path:
        working_dir = map_workspace(container.get("workingDir") or "/workspace", workspace)
        path = Path(working_dir)
        return path if path.is_relative_to(workspace) and path.is_dir() else workspace
