"""The CloudNativePG variant: the chart makes the `Cluster`, the app's login as a managed role,
and takes both database URLs from Secrets (CloudNativePG's for the owner, the login's own)."""

from __future__ import annotations

import copy

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from tests.contract.helm.chart import (
    KUBERNETES_VERSION,
    MINIMAL,
    Manifest,
    by_kind,
    containers,
    env,
    manifests,
    one,
    pod_spec,
    render,
    values_file,
    workloads,
)
from tests.contract.helm.cnpg_cluster_schema import CLUSTER

VALUES = values_file("values-cloudnativepg.yaml")


@pytest.fixture(scope="module")
def docs() -> list[Manifest]:
    return manifests(render(VALUES))


def test_the_cluster_uses_only_published_field_names(docs: list[Manifest]) -> None:
    cluster = one(docs, "Cluster")
    jsonschema.validate(cluster, CLUSTER)
    misspelt = copy.deepcopy(cluster)
    misspelt["spec"]["bootstrap"]["initdb"]["postInitApplicationSql"] = ["SELECT 1"]
    with pytest.raises(jsonschema.ValidationError, match="postInitApplicationSql"):
        jsonschema.validate(misspelt, CLUSTER)


def test_every_other_manifest_is_valid_for_kubernetes(docs: list[Manifest]) -> None:
    for doc in docs:
        if doc["kind"] != "Cluster":
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_cluster_bootstraps_the_owner_pgvector_and_the_app_login(docs: list[Manifest]) -> None:
    spec = one(docs, "Cluster")["spec"]
    assert spec["instances"] == 3
    assert spec["imageName"] == "ghcr.io/cloudnative-pg/postgresql:17"
    assert spec["enableSuperuserAccess"] is False
    initdb = spec["bootstrap"]["initdb"]
    assert (initdb["database"], initdb["owner"]) == ("memgate", "memgate")
    assert "CREATE EXTENSION IF NOT EXISTS vector" in initdb["postInitApplicationSQL"]
    roles = {role["name"]: role for role in spec["managed"]["roles"]}
    assert roles["memgate_app"]["login"] is False
    login = roles["memgate_api"]
    assert login["login"] is True
    assert login["inRoles"] == ["memgate_app"]
    assert not any(
        login[flag] for flag in ("superuser", "createrole", "createdb", "bypassrls", "replication")
    )
    # the operator's Secret: a chart-made random password changed on every offline render
    assert login["passwordSecret"] == {"name": "memgate-api-login"}
    assert [d["metadata"]["name"] for d in by_kind(docs, "Secret")] == []
    assert spec["storage"] == {"size": "50Gi", "storageClass": "fast-ssd"}


def test_the_database_urls_come_from_the_cluster_secrets(docs: list[Manifest]) -> None:
    api = env(containers(one(docs, "Deployment"))[0])
    password = api["MEMGATE_DB_LOGIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": "memgate-api-login", "key": "password"}
    # composed by Kubernetes from the variable above: no password in the manifest; the server
    # is checked against the Cluster's CA (sslmode=require sent the password to whoever
    # answered at the -rw address)
    assert api["DATABASE_URL"]["value"] == (
        "postgresql://memgate_api:$(MEMGATE_DB_LOGIN_PASSWORD)@memgate-pg-rw:5432/memgate"
        "?sslmode=verify-full&sslrootcert=/etc/memgate/postgres-ca/ca.crt"
    )
    job = one(docs, "Job")
    owner = env(pod_spec(job)["containers"][0])["MEMGATE_MIGRATION_DATABASE_URL"]
    assert owner["valueFrom"]["secretKeyRef"] == {"name": "memgate-pg-app", "key": "uri"}
    assert "helm.sh/hook" not in job["metadata"]["annotations"]  # waits for the Cluster's Secrets
    for doc in workloads(docs):
        if not any("DATABASE_URL" in env(c) for c in containers(doc)):
            continue  # the `helm test` pod
        spec = pod_spec(doc)
        ca = next(v for v in spec["volumes"] if v["name"] == "postgres-ca")
        assert ca["secret"] == {
            "secretName": "memgate-pg-ca",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],  # never the CA's private key
        }
        for container in containers(doc):
            variables = env(container)
            assert variables.get("MEMGATE_DB_LOGIN_PASSWORD", {}).get("value") is None
            # the owner's URL (CloudNativePG's `uri`) names no sslmode: libpq's defaults
            assert variables["PGSSLMODE"]["value"] == "verify-full"
            assert variables["PGSSLROOTCERT"]["value"] == "/etc/memgate/postgres-ca/ca.crt"
            mount = next(m for m in container["volumeMounts"] if m["name"] == "postgres-ca")
            assert mount == {
                "name": "postgres-ca",
                "mountPath": "/etc/memgate/postgres-ca",
                "readOnly": True,
            }


def test_a_cluster_needs_the_operators_login_secret() -> None:
    """A password the chart made with randAlphaNum changed on every offline render (Argo CD:
    lookup finds nothing), and CloudNativePG reset the role under the running pods."""
    without = copy.deepcopy(VALUES)
    del without["postgresql"]["cloudnativepg"]["appLogin"]
    with pytest.raises(helm.HelmRenderError, match=r"appLogin\.existingSecret is required"):
        render(without)
    assert manifests(render(VALUES)) == manifests(render(VALUES, is_upgrade=True))


def test_database_egress_goes_to_the_cluster_pods(docs: list[Manifest]) -> None:
    api = one(docs, "NetworkPolicy", "memgate-api")["spec"]
    selectors = [
        peer.get("podSelector", {}).get("matchLabels")
        for rule in api["egress"]
        for peer in rule["to"]
    ]
    assert {"cnpg.io/cluster": "memgate-pg"} in selectors


def test_a_cluster_refuses_the_migration_hook() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"needs migrations\.asHook=false"):
        render({**MINIMAL, "postgresql": {"cloudnativepg": {"enabled": True}}})


def test_no_cluster_without_the_toggle() -> None:
    assert by_kind(manifests(render(MINIMAL)), "Cluster") == []


def test_read_replicas_are_the_clusters_ro_service() -> None:
    assert "MEMGATE_READ_DATABASE_URL" not in env(containers(one(docs_of(VALUES), "Deployment"))[0])
    values = copy.deepcopy(VALUES)
    values["postgresql"]["cloudnativepg"]["readReplicas"] = True
    api = env(containers(one(docs_of(values), "Deployment"))[0])
    # The same login as DATABASE_URL (its password from the login's Secret), on `-ro`.
    assert api["MEMGATE_DB_LOGIN_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "password"
    assert api["MEMGATE_READ_DATABASE_URL"]["value"] == (
        "postgresql://memgate_api:$(MEMGATE_DB_LOGIN_PASSWORD)@memgate-pg-ro:5432/memgate?sslmode=require"
    )


def docs_of(values: dict[str, object]) -> list[Manifest]:
    return manifests(render(values))
