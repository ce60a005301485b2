"""The REST side of the test API server: the objects Craft creates, and Status errors.

Pods, Services, Events, Secrets, PersistentVolumeClaims and NetworkPolicies, kept in memory
by a `Cluster`, which only the server's event loop thread touches. A pod moves along a
timeline (Pending, then Running and Ready, or stuck on the way) computed from its age
whenever it is read, so there are no timers; it records the events a scheduler and a kubelet
would, which Craft shows as progress. A pod is scheduled only once every claim it mounts
exists and is not being deleted, and scheduling binds them (WaitForFirstConsumer); a claim
deleted while a pod uses it stays, with its pvc-protection finalizer, until no pod does.
Every object written is checked against Kubernetes' published schemas (`check_schema`).
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from aiohttp import web

# The schemas objects are checked against: those of the Kubernetes release the backend
# targets (PyPI kubernetes-validate, strict: unknown fields are refused, as a server with
# strict field validation does).
KUBERNETES_VERSION = "1.37.0"

# --------------------------------------------------------------------------------------------
# Status errors
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


def check_schema(obj: dict[str, Any], kind: str, api_version: str = "v1") -> None:
    """Refuse `obj` with a 422 Invalid, as an API server does, unless it is valid against
    the published schema of `kind` (unknown fields, types, required fields)."""
    document = {"kind": kind, "apiVersion": api_version, **obj}
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        name = str((obj.get("metadata") or {}).get("name", ""))
        path = field.lstrip(".") or "<root>"
        raise invalid(kind, name, path, "FieldValueInvalid", exc.message) from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise bad_request(f"no schema for {api_version} {kind}: {exc}") from None


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
# Query parameters: booleans and selectors
# --------------------------------------------------------------------------------------------

_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_go_bool(value: str) -> bool:
    """Parse a boolean the way Go's strconv.ParseBool does (the API server uses it)."""
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{value}": invalid syntax')


Term = tuple[str, str]  # (key, value): the key must equal the value

# Field selectors the real API server accepts for events (a subset of them); Craft reads a
# pod's events by `involvedObject.name`. Pods and services are only listed by label here.
EVENT_FIELDS = {
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.name",
    "involvedObject.namespace",
    "reason",
    "type",
}


def parse_selector(text: str) -> list[Term]:
    """Parse an equality selector such as `app=web,tier=db`.

    Anything else (`!=`, existence, set-based terms) is refused with a 400: this server does
    not model it, and a test that needs it should fail loudly, not match wrongly.
    """
    terms: list[Term] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        key, equals, value = part.partition("=")
        if not equals or key.endswith("!") or not key.strip():
            raise bad_request(f"unable to parse requirement: not modelled here: {part!r}")
        terms.append((key.strip(), value.strip().removeprefix("=").strip()))
    return terms


def dotted(obj: dict[str, Any], path: str) -> str:
    """Read `a.b.c` out of nested dicts; missing fields read as "" like the API server's."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, dict):
            return ""
        current = current.get(part)
    return "" if current is None else str(current)


def select(
    items: list[dict[str, Any]], labels: str, fields: str, supported: set[str]
) -> list[dict[str, Any]]:
    """Return the items whose labels and fields match the selectors of a list request."""
    label_terms = parse_selector(labels)
    field_terms = parse_selector(fields)
    for key, _ in field_terms:
        if key not in supported:
            raise bad_request(f"field label not supported: {key}")
    return [
        item
        for item in items
        if all((item["metadata"].get("labels") or {}).get(k) == v for k, v in label_terms)
        and all(dotted(item, k) == v for k, v in field_terms)
    ]


# --------------------------------------------------------------------------------------------
# The in-memory cluster
# --------------------------------------------------------------------------------------------

NODE_NAME = "kube-test-node"

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

# The storage class a claim that names none gets (DefaultStorageClass admission).
DEFAULT_STORAGE_CLASS = "standard"
PVC_PROTECTION = "kubernetes.io/pvc-protection"

UNSCHEDULABLE_MESSAGE = (
    "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
    "1 No preemption victims found for incoming pod."
)

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def rfc3339(when: float | None = None) -> str:
    """Format a wall-clock time the way the API server does (seconds, UTC, `Z`)."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Pod:
    """A pod plus what the server needs to move it along its timeline."""

    obj: dict[str, Any]
    plan: str
    ready_delay: float
    created: float  # monotonic clock
    applied: int = 0  # how many timeline steps have been applied
    blocked: str = ""  # why the scheduler cannot place it yet (a claim), "" if it can

    @property
    def claims(self) -> list[str]:
        """Return the names of the claims its volumes mount."""
        return [
            volume["persistentVolumeClaim"].get("claimName", "")
            for volume in self.obj["spec"].get("volumes") or []
            if isinstance(volume.get("persistentVolumeClaim"), dict)
        ]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.obj["metadata"]["namespace"]

    @property
    def containers(self) -> list[dict[str, Any]]:
        return self.obj["spec"]["containers"]


def _condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind, "status": "True" if status else "False"}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _container_status(
    container: dict[str, Any], *, waiting: tuple[str, str] | None = None, ready: bool = False
) -> dict[str, Any]:
    """Return a container's status: running when `waiting` is None, else waiting for it."""
    if waiting is None:
        state: dict[str, Any] = {"running": {"startedAt": rfc3339()}}
    else:
        reason, message = waiting
        state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state,
    }


class Cluster:
    """Pods, services, events and network policies, in one event loop thread."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Pod] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.network_policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        # Called with (namespace, pod) when a pod is deleted, so the server can stop its
        # processes; with (namespace, claim) when a claim is gone, so it can drop its data.
        self.on_pod_deleted: Callable[[str, str], None] = lambda namespace, name: None
        self.on_claim_deleted: Callable[[str, str], None] = lambda namespace, name: None

    @staticmethod
    def _name(kind: str, namespace: str, body: dict[str, Any]) -> str:
        metadata = body.get("metadata") or {}
        if metadata.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        name = metadata.get("name") or ""
        if not name:
            raise invalid(
                kind, "", "metadata.name", "FieldValueRequired", "Required value: name is required"
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

    @staticmethod
    def _object(
        kind: str, api_version: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        metadata = {**(body.get("metadata") or {}), "name": name, "namespace": namespace}
        metadata["uid"] = str(uuid.uuid4())
        return {"kind": kind, "apiVersion": api_version, "metadata": metadata}

    # -- pods ---------------------------------------------------------------------------------

    def create_pod(
        self, namespace: str, body: dict[str, Any], *, plan: str, ready_delay: float
    ) -> Pod:
        name = self._name("Pod", namespace, body)
        check_schema(body, "Pod")
        if (namespace, name) in self.pods:
            raise already_exists("pods", name)
        spec = body.get("spec") or {}
        containers = spec.get("containers") or []
        if not containers:
            raise invalid("Pod", name, "spec.containers", "FieldValueRequired", "Required value")
        for position, container in enumerate(containers):
            for required in ("name", "image"):
                if not container.get(required):
                    raise invalid(
                        "Pod",
                        name,
                        f"spec.containers[{position}].{required}",
                        "FieldValueRequired",
                        "Required value",
                    )
        obj = self._object("Pod", "v1", namespace, name, body)
        obj["spec"] = spec
        obj["status"] = {"phase": "Pending"}
        pod = Pod(obj, plan, max(0.0, ready_delay), time.monotonic())
        self.pods[(namespace, name)] = pod
        self._advance(pod)
        return pod

    def get_pod(self, namespace: str, name: str) -> Pod:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise not_found("pods", name)
        self._advance(pod)
        return pod

    def list_pods(self, namespace: str) -> list[Pod]:
        pods = [pod for (ns, _), pod in sorted(self.pods.items()) if ns == namespace]
        for pod in pods:
            self._advance(pod)
        return pods

    def patch_pod_labels(self, namespace: str, name: str, operations: list[Any]) -> Pod:
        """Apply a JSON Patch (RFC 6902) to the pod's labels, all or nothing (`patch_labels`)."""
        pod = self.get_pod(namespace, name)
        labels = patch_labels(pod.obj, operations, "pods")
        check_schema(_with_labels(pod.obj, labels), "Pod")
        pod.obj["metadata"]["labels"] = labels
        return pod

    def delete_pod(self, namespace: str, name: str) -> Pod:
        """Delete the pod at once (no grace period is modelled) and stop its processes; then
        the claims being deleted that no pod uses any more go."""
        pod = self.get_pod(namespace, name)
        del self.pods[(namespace, name)]
        pod.obj["metadata"]["deletionTimestamp"] = rfc3339()
        self.on_pod_deleted(namespace, name)
        for claim in pod.claims:
            found = self.claims.get((namespace, claim))
            if found is not None and found["metadata"].get("deletionTimestamp"):
                self._remove_claim_unless_used(namespace, claim)
        return pod

    def _advance(self, pod: Pod) -> None:
        timeline = TIMELINES[pod.plan]
        if pod.applied == 0 and timeline[0][1] == "scheduled" and not self._schedulable(pod):
            return
        elapsed = time.monotonic() - pod.created
        while pod.applied < len(timeline):
            factor, step = timeline[pod.applied]
            if elapsed < factor * pod.ready_delay:
                break
            getattr(self, f"_step_{step}")(pod)
            pod.applied += 1

    def _schedulable(self, pod: Pod) -> bool:
        """Return whether every claim the pod mounts can be had; if not, keep it Pending
        with the scheduler's condition and event (once per reason), and start its timeline
        afresh when it can."""
        why = ""
        for name in pod.claims:
            claim = self.claims.get((pod.namespace, name))
            if claim is None:
                why = f'persistentvolumeclaim "{name}" not found'
            elif claim["metadata"].get("deletionTimestamp"):
                why = f'persistentvolumeclaim "{name}" is being deleted'
            if why:
                break
        if not why:
            if pod.blocked:
                pod.blocked, pod.created = "", time.monotonic()
            return True
        if why != pod.blocked:
            pod.blocked = why
            message = (
                f"0/1 nodes are available: {why}. preemption: 0/1 nodes are available: "
                "1 Preemption is not helpful for scheduling."
            )
            pod.obj["status"].update(
                phase="Pending",
                conditions=[_condition("PodScheduled", False, "Unschedulable", message)],
            )
            self._record_event(
                pod, "FailedScheduling", message, component="default-scheduler", warning=True
            )
        return False

    # -- pod timeline steps ---------------------------------------------------------------------

    def _step_scheduled(self, pod: Pod) -> None:
        for name in pod.claims:  # WaitForFirstConsumer: bound where its first pod runs
            self._bind(self.claims[(pod.namespace, name)])
        self._schedule(pod)

    def _bind(self, claim: dict[str, Any]) -> None:
        if claim["status"].get("phase") == "Bound":
            return
        spec = claim["spec"]
        spec["volumeName"] = f"pvc-{claim['metadata']['uid']}"
        claim["status"] = {
            "phase": "Bound",
            "accessModes": list(spec.get("accessModes") or []),
            "capacity": dict((spec.get("resources") or {}).get("requests") or {}),
        }

    def _schedule(self, pod: Pod) -> None:
        pod.obj["spec"]["nodeName"] = NODE_NAME
        unready = self._unready_message(pod)
        pod.obj["status"].update(
            phase="Pending",
            conditions=[
                _condition("Initialized", True),
                _condition("Ready", False, "ContainersNotReady", unready),
                _condition("ContainersReady", False, "ContainersNotReady", unready),
                _condition("PodScheduled", True),
            ],
            containerStatuses=[
                _container_status(c, waiting=("ContainerCreating", "")) for c in pod.containers
            ],
        )
        self._record_event(
            pod,
            "Scheduled",
            f"Successfully assigned {pod.namespace}/{pod.name} to {NODE_NAME}",
            component="default-scheduler",
        )
        for container in pod.containers:
            self._record_event(pod, "Pulling", f'Pulling image "{container["image"]}"')

    def _step_running(self, pod: Pod, ready: bool = True) -> None:
        unready = "" if ready else self._unready_message(pod)
        reason = "" if ready else "ContainersNotReady"
        pod.obj["status"].update(
            phase="Running",
            # Exec'd processes run on this machine: the pod's address is its loopback.
            podIP="127.0.0.1",
            conditions=[
                _condition("Initialized", True),
                _condition("Ready", ready, reason, unready),
                _condition("ContainersReady", ready, reason, unready),
                _condition("PodScheduled", True),
            ],
            containerStatuses=[_container_status(c, ready=ready) for c in pod.containers],
        )
        for container in pod.containers:
            name, image = container["name"], container["image"]
            self._record_event(pod, "Pulled", f'Successfully pulled image "{image}" in 1.2s')
            self._record_event(pod, "Created", f"Created container {name}")
            self._record_event(pod, "Started", f"Started container {name}")
            if not ready:
                self._record_event(
                    pod, "Unhealthy", "Readiness probe failed: not ready", warning=True
                )

    def _step_running_unready(self, pod: Pod) -> None:
        self._step_running(pod, ready=False)

    def _step_err_image_pull(self, pod: Pod) -> None:
        self._image_failure(pod, backoff=False)

    def _step_image_pull_backoff(self, pod: Pod) -> None:
        self._image_failure(pod, backoff=True)

    def _image_failure(self, pod: Pod, *, backoff: bool) -> None:
        statuses = []
        for container in pod.containers:
            image = container["image"]
            pull_error = (
                f'failed to pull and unpack image "{image}": failed to resolve reference '
                f'"{image}": {image}: not found'
            )
            if backoff:
                waiting = (
                    "ImagePullBackOff",
                    f'Back-off pulling image "{image}": ErrImagePull: {pull_error}',
                )
                self._record_event(pod, "BackOff", f'Back-off pulling image "{image}"')
                self._record_event(pod, "Failed", "Error: ImagePullBackOff", warning=True)
            else:
                waiting = ("ErrImagePull", pull_error)
                self._record_event(
                    pod, "Failed", f'Failed to pull image "{image}": {pull_error}', warning=True
                )
                self._record_event(pod, "Failed", "Error: ErrImagePull", warning=True)
            statuses.append(_container_status(container, waiting=waiting))
        pod.obj["status"]["containerStatuses"] = statuses

    def _step_unschedulable(self, pod: Pod) -> None:
        pod.obj["status"].update(
            phase="Pending",
            conditions=[_condition("PodScheduled", False, "Unschedulable", UNSCHEDULABLE_MESSAGE)],
        )
        self._record_event(
            pod,
            "FailedScheduling",
            UNSCHEDULABLE_MESSAGE,
            component="default-scheduler",
            warning=True,
        )

    @staticmethod
    def _unready_message(pod: Pod) -> str:
        names = " ".join(c["name"] for c in pod.containers)
        return f"containers with unready status: [{names}]"

    # -- events -------------------------------------------------------------------------------

    def _record_event(
        self,
        pod: Pod,
        reason: str,
        message: str,
        *,
        component: str = "kubelet",
        warning: bool = False,
    ) -> None:
        # Named like the kubelet's recorder does: pod name plus the time in hex nanoseconds,
        # so listing (sorted by name, as etcd returns it) gives a pod's events in order.
        stamp = time.time_ns()
        while (pod.namespace, f"{pod.name}.{stamp:x}") in self.events:
            stamp += 1
        name = f"{pod.name}.{stamp:x}"
        now = rfc3339()
        self.events[(pod.namespace, name)] = {
            "metadata": {"name": name, "namespace": pod.namespace},
            "involvedObject": {"kind": "Pod", "namespace": pod.namespace, "name": pod.name},
            "reason": reason,
            "message": message,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": "Warning" if warning else "Normal",
        }

    def list_events(self, namespace: str) -> list[dict[str, Any]]:
        self.list_pods(namespace)  # events appear as pods move along
        return [e for (ns, _), e in sorted(self.events.items()) if ns == namespace]

    # -- services -----------------------------------------------------------------------------

    def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = self._name("Service", namespace, body)
        check_schema(body, "Service")
        if (namespace, name) in self.services:
            raise already_exists("services", name)
        service = self._object("Service", "v1", namespace, name, body)
        service["spec"] = body.get("spec") or {}
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
        return service

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        return [s for (ns, _), s in sorted(self.services.items()) if ns == namespace]

    # -- secrets (data as base64, as the API serves it) ----------------------------------------

    def _secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        check_schema(body, "Secret")
        secret = self._object("Secret", "v1", namespace, name, body)
        data = dict(body.get("data") or {})
        for key, value in (body.get("stringData") or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        for key, value in data.items():
            if not _SECRET_KEY.fullmatch(key):
                raise invalid("Secret", name, f"data[{key}]", "FieldValueInvalid", "Invalid value")
            try:
                base64.b64decode(value, validate=True)
            except (ValueError, TypeError):
                raise bad_request(f"illegal base64 data in data[{key}]") from None
        secret["data"] = data
        secret["type"] = body.get("type") or "Opaque"
        return secret

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = self._name("Secret", namespace, body)
        if (namespace, name) in self.secrets:
            raise already_exists("secrets", name)
        secret = self._secret(namespace, name, body)
        self.secrets[(namespace, name)] = secret
        return secret

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a secret (PUT); resource versions are not modelled, so none is checked."""
        old = self.get_secret(namespace, name)
        if self._name("Secret", namespace, body) != name:
            raise bad_request("the name of the object does not match the name on the URL")
        secret = self._secret(namespace, name, body)
        secret["metadata"]["uid"] = old["metadata"]["uid"]
        self.secrets[(namespace, name)] = secret
        return secret

    def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        secret = self.secrets.get((namespace, name))
        if secret is None:
            raise not_found("secrets", name)
        return secret

    def delete_secret(self, namespace: str, name: str) -> dict[str, Any]:
        secret = self.get_secret(namespace, name)
        del self.secrets[(namespace, name)]
        return secret

    def list_secrets(self, namespace: str) -> list[dict[str, Any]]:
        return [s for (ns, _), s in sorted(self.secrets.items()) if ns == namespace]

    # -- network policies (stored, not enforced) -----------------------------------------------

    def create_network_policy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = self._name("NetworkPolicy", namespace, body)
        check_schema(body, "NetworkPolicy", "networking.k8s.io/v1")
        if (namespace, name) in self.network_policies:
            raise already_exists("networkpolicies.networking.k8s.io", name)
        policy = self._object("NetworkPolicy", "networking.k8s.io/v1", namespace, name, body)
        policy["spec"] = body.get("spec") or {}
        self.network_policies[(namespace, name)] = policy
        return policy

    def get_network_policy(self, namespace: str, name: str) -> dict[str, Any]:
        policy = self.network_policies.get((namespace, name))
        if policy is None:
            raise not_found("networkpolicies.networking.k8s.io", name)
        return policy

    # -- persistent volume claims: Pending until a pod that mounts one is scheduled -------------

    def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = self._name("PersistentVolumeClaim", namespace, body)
        check_schema(body, "PersistentVolumeClaim")
        if (namespace, name) in self.claims:
            raise already_exists("persistentvolumeclaims", name)
        spec = dict(body.get("spec") or {})
        for required in ("accessModes", "resources"):
            if not spec.get(required):
                raise invalid(
                    "PersistentVolumeClaim",
                    name,
                    f"spec.{required}",
                    "FieldValueRequired",
                    "Required value",
                )
        spec.setdefault("storageClassName", DEFAULT_STORAGE_CLASS)
        spec.setdefault("volumeMode", "Filesystem")
        claim = self._object("PersistentVolumeClaim", "v1", namespace, name, body)
        claim["metadata"]["finalizers"] = [PVC_PROTECTION]
        claim["spec"] = spec
        claim["status"] = {"phase": "Pending"}
        self.claims[(namespace, name)] = claim
        return claim

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.list_pods(namespace)  # scheduling binds claims
        claim = self.claims.get((namespace, name))
        if claim is None:
            raise not_found("persistentvolumeclaims", name)
        return claim

    def list_claims(self, namespace: str) -> list[dict[str, Any]]:
        self.list_pods(namespace)
        return [c for (ns, _), c in sorted(self.claims.items()) if ns == namespace]

    def patch_claim_labels(
        self, namespace: str, name: str, operations: list[Any]
    ) -> dict[str, Any]:
        claim = self.get_claim(namespace, name)
        labels = patch_labels(claim, operations, "persistentvolumeclaims")
        check_schema(_with_labels(claim, labels), "PersistentVolumeClaim")
        claim["metadata"]["labels"] = labels
        return claim

    def delete_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """Delete the claim, or, while a pod uses it, mark it deleted (pvc-protection): it
        and its data go when the last pod that uses it does."""
        claim = self.get_claim(namespace, name)
        claim["metadata"].setdefault("deletionTimestamp", rfc3339())
        self._remove_claim_unless_used(namespace, name)
        return claim

    def _remove_claim_unless_used(self, namespace: str, name: str) -> None:
        if any(name in pod.claims for (ns, _), pod in self.pods.items() if ns == namespace):
            return
        del self.claims[(namespace, name)]
        self.on_claim_deleted(namespace, name)


def patch_labels(obj: dict[str, Any], operations: list[Any], resource: str) -> dict[str, str]:
    """Return the labels of `obj` after a JSON Patch (RFC 6902), or raise: all or nothing.

    Only what relabelling needs is modelled: `test`, `add`, `replace` and `remove` on
    `/metadata/labels/<key>` (`~1` for `/`), and `add` or `replace` of `/metadata/labels`
    as a whole. A failed `test` is a 422, as in Kubernetes, and changes nothing: the
    compare-and-swap a warm pod's claim relies on.
    """
    name = obj["metadata"]["name"]
    labels = dict(obj["metadata"].get("labels") or {})
    prefix = "/metadata/labels/"
    for operation in operations:
        op = operation.get("op") if isinstance(operation, dict) else None
        path = operation.get("path", "") if isinstance(operation, dict) else ""
        if op in ("add", "replace") and path == "/metadata/labels":
            value = operation.get("value")
            if not isinstance(value, dict):
                raise bad_request("the labels of an object are a map of strings")
            labels = dict(value)  # the schema check says whether they are strings
            continue
        if op not in ("test", "add", "replace", "remove") or not path.startswith(prefix):
            raise bad_request(f"JSON patch operation not modelled by this test server: {operation}")
        key = path[len(prefix) :].replace("~1", "/").replace("~0", "~")
        if op == "test" and labels.get(key) != operation.get("value"):
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: test "
                f'operation on "{path}" failed',
                {"name": name, "kind": resource},
            )
        if op in ("replace", "remove") and key not in labels:
            raise ApiError(
                422,
                "Invalid",
                f'{op} operation does not apply: doc is missing path: "{path}"',
                {"name": name, "kind": resource},
            )
        if op in ("add", "replace"):
            labels[key] = str(operation.get("value"))
        elif op == "remove":
            del labels[key]
    return labels


def _with_labels(obj: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}
