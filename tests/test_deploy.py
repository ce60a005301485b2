"""The deployment files parse and are valid Kubernetes objects that agree with the code."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from kubernetes import client as kubernetes

DEPLOY = Path(settings.BASE_DIR) / "deploy"
MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Service"): "V1Service",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}


def manifests() -> list[dict]:
    documents = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        documents += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return documents


def by_kind(kind: str) -> list[dict]:
    return [doc for doc in manifests() if doc["kind"] == kind]


def test_every_manifest_is_a_known_kubernetes_object_without_unknown_fields():
    api = kubernetes.ApiClient()
    for doc in manifests():
        model = MODELS[(doc["apiVersion"], doc["kind"])]
        obj = api.deserialize(json.dumps(doc), model, "application/json")
        # A misspelt or misplaced field is dropped by the model: the round trip shows it.
        assert api.sanitize_for_serialization(obj) == doc, doc["metadata"]["name"]


def test_every_manifest_is_valid_against_the_published_schemas():
    """As an API server of the release the backend targets checks it: unknown fields, types,
    required fields (the test API server checks what Craft sends the same way)."""
    from tests.kubeapi.objects import KUBERNETES_VERSION

    documents = manifests()
    assert documents
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_role_grants_exactly_what_the_kubernetes_backend_calls():
    (role,) = by_kind("Role")
    granted = {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("pods", "create"),
        ("pods", "get"),
        ("pods", "list"),  # the reaper's inventory, the warm pool's pass
        ("pods", "patch"),  # a warm pod's labels, when a sandbox claims it
        ("pods", "delete"),
        ("pods/exec", "create"),
        ("services", "create"),
        ("services", "list"),  # the reaper's inventory
        ("services", "delete"),
        ("events", "list"),
        ("networkpolicies", "create"),
        # Each sandbox's credentials (docs/agents.md): written before an agent starts.
        ("secrets", "create"),
        ("secrets", "get"),
        ("secrets", "update"),
        ("secrets", "list"),  # the reaper's inventory
        ("secrets", "delete"),
        # Each sandbox's volume claim (its files): made or adopted (a 409, then read) before
        # its pod, relabelled when a warm one is claimed, deleted with the sandbox.
        ("persistentvolumeclaims", "create"),
        ("persistentvolumeclaims", "get"),
        ("persistentvolumeclaims", "list"),  # the reaper's inventory
        ("persistentvolumeclaims", "patch"),
        ("persistentvolumeclaims", "delete"),
    }
    assert role["metadata"]["namespace"] == settings.CRAFT_K8S_NAMESPACE


def test_the_deployment_runs_as_the_bound_service_account_in_the_sandbox_namespace():
    (deployment,) = by_kind("Deployment")
    (binding,) = by_kind("RoleBinding")
    spec = deployment["spec"]["template"]["spec"]
    (subject,) = binding["subjects"]
    assert spec["serviceAccountName"] == subject["name"]
    assert deployment["metadata"]["namespace"] == subject["namespace"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["CRAFT_SANDBOX_BACKEND"] == "kubernetes"
    assert env["CRAFT_K8S_NAMESPACE"] == binding["metadata"]["namespace"]
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_every_setting_the_deployment_sets_is_one_craft_reads():
    (deployment,) = by_kind("Deployment")
    names = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    source = (Path(settings.BASE_DIR) / "craft" / "settings.py").read_text()
    for name in names:
        assert f'"{name.removesuffix("_FILE")}"' in source, name


@pytest.mark.parametrize("image", ["sandbox-image", "craft-image"])
def test_the_dockerfiles_copy_only_what_exists(image):
    dockerfile = (DEPLOY / image / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (Path(settings.BASE_DIR) / source).exists(), source
    assert "USER 1000" in dockerfile


def test_the_deployment_runs_several_workers_that_drain_before_they_stop():
    (deployment,) = by_kind("Deployment")
    (budget,) = by_kind("PodDisruptionBudget")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert deployment["spec"]["replicas"] >= 2
    assert "REDIS_URL" in env and "DATABASE_URL" in env, "workers meet through these"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    grace = float(env["CRAFT_SHUTDOWN_GRACE_SECONDS"])
    assert spec["terminationGracePeriodSeconds"] >= grace + 15
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
