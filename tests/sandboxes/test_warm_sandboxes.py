"""Warm sandboxes (CRAFT_K8S_WARM_SANDBOXES): ready pods with no owner, claimed by new users'
sandboxes, with the real kubernetes client against the test API server and the real database.

The pool is tended by the reaper thread (`warm.tend`); here each test calls it, as that
thread would, and waits for the pods it started to be Ready.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from kubernetes import client as kubernetes
from kubernetes.client.rest import ApiException

from craft.session_activity import session_activity
from sandboxes import reaper, services, warm
from sandboxes.backends.kubernetes import (
    NETWORK_POLICY,
    WARM_LABEL,
    claim_name,
    pod_name,
    secret_name,
)
from sandboxes.models import Sandbox, WarmSandbox
from tests.ready import settled_sandbox

from .agents import reply_text, run_turn
from .backends.test_kubernetes_backend import keyed_launch
from .kube import NAMESPACE, agent_execs

pytestmark = pytest.mark.django_db(transaction=True)

POST_POD = ("POST", f"/api/v1/namespaces/{NAMESPACE}/pods")
POST_CLAIM = ("POST", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims")


def user(name: str):
    return get_user_model().objects.create_user(name, password="x")


@pytest.fixture
def pool(kube_backend, kube, settings):
    """Two warm sandboxes, Ready, as the reaper thread leaves them; return the backend."""
    settings.CRAFT_K8S_WARM_SANDBOXES = 2
    fill_pool(2)
    return kube_backend


def fill_pool(size: int, timeout: float = 10) -> list[WarmSandbox]:
    """Tend the pool until `size` warm sandboxes are ready (and no more rows exist)."""
    deadline = time.monotonic() + timeout
    while True:
        warm.tend()
        rows = list(WarmSandbox.objects.all())
        if len(rows) == size and all(r.status == WarmSandbox.Status.READY for r in rows):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)


def pods(kube_backend, selector: str = "app.kubernetes.io/name=craft-sandbox") -> dict:
    found = kube_backend.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return {pod.metadata.name: pod for pod in found}


# --- claiming -----------------------------------------------------------------------------


def test_a_new_users_sandbox_claims_a_warm_pod_and_its_agent_runs_there(pool, kube, owner):
    warm_ids = {row.pk for row in WarmSandbox.objects.all()}
    kube.requests.clear()

    sandbox = settled_sandbox(services.request_sandbox(owner).pk)

    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    assert sandbox.pk in warm_ids
    assert sandbox.reference == pod_name(sandbox)
    assert POST_POD not in kube.requests  # no pod was created on its path
    assert POST_CLAIM not in kube.requests  # nor a claim: the warm pod's is the sandbox's now
    assert WarmSandbox.objects.filter(pk=sandbox.pk).count() == 0
    session = uuid.uuid4()
    connection = services.connect_agent(sandbox, session)
    assert "Wrote hello.txt." in reply_text(run_turn(connection, "write hello.txt hi"))
    (agent,) = agent_execs(kube)
    assert agent.pod == pod_name(sandbox)
    claim = pool.core.read_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    assert claim.metadata.labels == pool.labels(sandbox)  # the owner's, like the pod's
    assert claim.status.phase == "Bound"
    folder = kube.claim_folder(NAMESPACE, claim_name(sandbox))
    assert (folder / "workspace" / "sessions" / str(session) / "hello.txt").read_text() == "hi"


def test_the_claimed_pod_carries_its_owners_labels_policy_and_credentials_secret(pool, kube, owner):
    sandbox = settled_sandbox(services.request_sandbox(owner).pk)
    api = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))

    pod = api.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    assert pod.metadata.labels == pool.labels(sandbox)  # owner and sandbox; warm label gone
    assert WARM_LABEL not in pod.metadata.labels
    policy = kubernetes.NetworkingV1Api(
        kubernetes.ApiClient(kube.configuration())
    ).read_namespaced_network_policy(NETWORK_POLICY, NAMESPACE)
    assert policy.spec.pod_selector.match_labels.items() <= pod.metadata.labels.items()
    service = api.read_namespaced_service(pod_name(sandbox), NAMESPACE)
    assert service.metadata.labels == pool.labels(sandbox)
    assert service.spec.selector == {"craft.dev/sandbox": str(sandbox.id)}

    secret = api.read_namespaced_secret(secret_name(sandbox), NAMESPACE)
    assert secret.metadata.labels == pool.labels(sandbox)
    assert not secret.data  # nothing of anyone's before its owner's agent needs a key
    (volume,) = [v for v in pod.spec.volumes if v.secret is not None]
    assert volume.secret.secret_name == secret_name(sandbox)

    # The owner's key reaches the agent in the claimed pod through that Secret.
    launch = keyed_launch({"PROVIDER_API_KEY": "sk-warm-0123456789"})
    connection = services.connect_agent(sandbox, uuid.uuid4(), launch=launch)
    assert '"PROVIDER_API_KEY": "sk-warm-0123456789"' in reply_text(run_turn(connection, "env"))


def test_a_warm_pod_deleted_behind_crafts_back_is_never_claimed(pool, kube, owner):
    rows = list(WarmSandbox.objects.order_by("slot"))
    first = rows[0]  # claims take the lowest slot
    pool.core.delete_namespaced_pod(f"craft-sandbox-{first.pk}", NAMESPACE)

    sandbox = settled_sandbox(services.request_sandbox(owner).pk)

    # Its row was taken before anyone knew: the claim read the pod, found it gone, and
    # gave the sandbox a fresh pod instead.
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    pod = pool.core.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    assert pod.metadata.labels == pool.labels(sandbox)
    assert ("POST", f"/api/v1/namespaces/{NAMESPACE}/pods") in kube.requests
    # The other warm pod is untouched, still warm, and the pool refills the taken slot.
    assert WARM_LABEL in pods(pool)[f"craft-sandbox-{rows[1].pk}"].metadata.labels
    fill_pool(2)


def test_the_pool_drops_a_warm_pod_that_vanished_before_anyone_claims_it(pool, kube, stranger):
    rows = list(WarmSandbox.objects.order_by("slot"))
    pool.core.delete_namespaced_pod(f"craft-sandbox-{rows[0].pk}", NAMESPACE)

    refilled = fill_pool(2)

    assert rows[0].pk not in {r.pk for r in refilled}
    assert rows[1].pk in {r.pk for r in refilled}
    sandbox = settled_sandbox(services.request_sandbox(stranger).pk)
    assert sandbox.status == Sandbox.Status.RUNNING
    assert sandbox.pk in {r.pk for r in refilled}


def test_a_warm_pod_that_is_not_ready_at_claim_is_dropped_for_a_fresh_one(pool, kube, owner):
    first = WarmSandbox.objects.order_by("slot").first()
    pod = kube.cluster.get_pod(NAMESPACE, f"craft-sandbox-{first.pk}")
    # It failed after the pool saw it Ready (the test server's pod, as a kubelet reports it).
    pod.obj["status"].update(
        phase="Failed", reason="Evicted", message="The node was low on memory."
    )

    sandbox = settled_sandbox(services.request_sandbox(owner).pk)

    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    assert sandbox.pk == first.pk  # same name, a new pod
    assert pool.core.read_namespaced_pod(pod_name(sandbox), NAMESPACE).status.phase == "Running"


def test_a_claim_cut_short_is_finished_by_the_next_provisioning(pool, kube, owner):
    # The server that took the warm row stopped before it relabelled the pod: the sandbox is
    # failed (the reaper's re-claim), and provisioning it again adopts the pod, as its own.
    with transaction.atomic():
        taken = warm.take("kubernetes")
        Sandbox.objects.create(
            id=taken, owner=owner, backend="kubernetes", status=Sandbox.Status.FAILED
        )
    uid = pool.core.read_namespaced_pod(f"craft-sandbox-{taken}", NAMESPACE).metadata.uid

    sandbox = services.provision_sandbox(owner)

    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    assert sandbox.pk == taken
    pod = pool.core.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    assert pod.metadata.uid == uid
    assert pod.metadata.labels == pool.labels(sandbox)
    secret = pool.core.read_namespaced_secret(secret_name(sandbox), NAMESPACE)
    assert secret.metadata.labels == pool.labels(sandbox)
    claim = pool.core.read_namespaced_persistent_volume_claim(claim_name(sandbox), NAMESPACE)
    assert claim.metadata.labels == pool.labels(sandbox)


def test_a_pod_already_claimed_is_never_claimed_again(pool, kube, owner):
    # The database row is the first guard; the pod's warm label is the second: the claim's
    # JSON patch tests it, and the API server refuses the whole patch when it fails.
    row = WarmSandbox.objects.order_by("slot").first()
    name = f"craft-sandbox-{row.pk}"
    pool.core.patch_namespaced_pod(
        name,
        NAMESPACE,
        [{"op": "replace", "path": "/metadata/labels/craft.dev~1warm", "value": "false"}],
        _content_type="application/json-patch+json",
    )
    with pytest.raises(ApiException) as refused:
        pool.core.patch_namespaced_pod(
            name,
            NAMESPACE,
            [
                {"op": "test", "path": "/metadata/labels/craft.dev~1warm", "value": "true"},
                {"op": "add", "path": "/metadata/labels/craft.dev~1owner", "value": "1"},
            ],
            _content_type="application/json-patch+json",
        )
    assert refused.value.status == 422
    assert "craft.dev/owner" not in pool.core.read_namespaced_pod(name, NAMESPACE).metadata.labels


# --- two workers, one warm pod ----------------------------------------------------------


@pytest.mark.skipif(
    "postgresql" not in connection.vendor, reason="row locks are PostgreSQL's (SQLite has none)"
)
def test_two_workers_claiming_the_last_warm_pod_at_once_get_one_each_way(kube_backend, settings):
    settings.CRAFT_K8S_WARM_SANDBOXES = 1
    (last,) = fill_pool(1)
    alice, bob = user("alice"), user("bob")
    alice_took = threading.Event()
    bob_done = threading.Event()
    results: dict[str, Sandbox] = {}
    errors: list[BaseException] = []

    def worker_a() -> None:
        try:
            # Alice's request takes the warm row and holds its transaction open...
            with transaction.atomic():
                results["alice"] = services.request_sandbox(alice)
                alice_took.set()
                assert bob_done.wait(30), "bob waited on alice's lock"
        except BaseException as exc:
            errors.append(exc)
            alice_took.set()
        finally:
            connection.close()

    def worker_b() -> None:
        try:
            assert alice_took.wait(30)
            # ...while Bob's, on another connection, claims at the same moment.
            results["bob"] = services.provision_sandbox(bob)
        except BaseException as exc:
            errors.append(exc)
        finally:
            bob_done.set()
            connection.close()

    threads = [threading.Thread(target=worker_a), threading.Thread(target=worker_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors

    alice_sandbox = settled_sandbox(results["alice"].pk)
    bob_sandbox = results["bob"]
    assert alice_sandbox.status == bob_sandbox.status == Sandbox.Status.RUNNING
    assert alice_sandbox.pk == last.pk  # exactly one got it
    assert bob_sandbox.pk != last.pk  # the other skipped the locked row: a fresh pod
    labels = {name: pod.metadata.labels for name, pod in pods(kube_backend).items()}
    assert labels[pod_name(alice_sandbox)]["craft.dev/owner"] == str(alice.pk)
    assert labels[pod_name(bob_sandbox)]["craft.dev/owner"] == str(bob.pk)
    assert not WarmSandbox.objects.filter(pk=last.pk).exists()  # taken, not back in the pool


@pytest.mark.skipif(
    "postgresql" not in connection.vendor, reason="row locks are PostgreSQL's (SQLite has none)"
)
def test_two_workers_racing_for_one_warm_pod_never_both_get_it(kube_backend, settings):
    settings.CRAFT_K8S_WARM_SANDBOXES = 1
    for round in range(3):
        (last,) = fill_pool(1)
        users = [user(f"racer-{round}-{n}") for n in range(2)]
        start = threading.Barrier(2)
        results: list[Sandbox] = []

        def claim(person, start=start, results=results) -> None:
            try:
                start.wait(10)
                results.append(services.provision_sandbox(person))
            finally:
                connection.close()

        threads = [threading.Thread(target=claim, args=(u,)) for u in users]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert [s.status for s in results] == [Sandbox.Status.RUNNING] * 2
        assert sorted(s.pk == last.pk for s in results) == [False, True]
        assert len({pod_name(s) for s in results}) == 2


# --- the pool -----------------------------------------------------------------------------


def test_the_pool_is_replenished_after_a_claim_and_its_surplus_reaped(pool, kube, owner, settings):
    before = {row.pk for row in WarmSandbox.objects.all()}
    claimed = settled_sandbox(services.request_sandbox(owner).pk)
    assert WarmSandbox.objects.count() == 1

    after = {row.pk for row in fill_pool(2)}  # the reaper thread's next passes

    assert len(after - before) == 1 and claimed.pk not in after
    warm_pods = pods(pool, f"{WARM_LABEL}=true")
    assert set(warm_pods) == {f"craft-sandbox-{pk}" for pk in after}
    assert all(p.metadata.labels.get("craft.dev/owner") is None for p in warm_pods.values())

    settings.CRAFT_K8S_WARM_SANDBOXES = 1  # lowered: the surplus goes
    (kept,) = fill_pool(1)
    assert kept.slot == 0
    assert set(pods(pool, f"{WARM_LABEL}=true")) == {f"craft-sandbox-{kept.pk}"}
    assert {s.metadata.name for s in pool.core.list_namespaced_secret(NAMESPACE).items} == {
        f"craft-sandbox-{kept.pk}-credentials",
        secret_name(claimed),
    }

    settings.CRAFT_K8S_WARM_SANDBOXES = 0  # off: none left
    fill_pool(0)
    assert not pods(pool, f"{WARM_LABEL}=true")
    # The claimed sandbox was never the pool's to reap.
    assert pool.core.read_namespaced_pod(pod_name(claimed), NAMESPACE)


def test_the_reaper_keeps_warm_pods_and_removes_them_once_their_row_is_gone(pool, kube):
    rows = list(WarmSandbox.objects.all())
    report = reaper.reap_sandboxes(session_activity)
    assert not [a for a in report.actions if "craft-sandbox-" in a.target], report.actions
    assert len(pods(pool, f"{WARM_LABEL}=true")) == 2

    WarmSandbox.objects.filter(pk=rows[0].pk).delete()  # a process died between the two
    report = reaper.reap_sandboxes(session_activity)

    assert sorted(a.target for a in report.actions) == [
        f"claim craft-sandbox-{rows[0].pk}",
        f"pod craft-sandbox-{rows[0].pk}",
        f"secret craft-sandbox-{rows[0].pk}-credentials",
    ]
    assert set(pods(pool, f"{WARM_LABEL}=true")) == {f"craft-sandbox-{rows[1].pk}"}


def test_workers_tending_at_once_never_overfill_the_pool(kube_backend, settings):
    settings.CRAFT_K8S_WARM_SANDBOXES = 3
    start = threading.Barrier(4)

    def tend() -> None:
        try:
            start.wait(10)
            warm.tend()
        finally:
            connection.close()

    threads = [threading.Thread(target=tend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    fill_pool(3)
    assert len(pods(kube_backend, f"{WARM_LABEL}=true")) == 3


def test_no_pool_no_warm_pods(kube_backend, kube, owner):
    warm.tend()
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.RUNNING
    assert not WarmSandbox.objects.exists()
    assert not pods(kube_backend, f"{WARM_LABEL}=true")
