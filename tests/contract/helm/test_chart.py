"""helm/memgate renders, validates and holds its security promises, for the defaults (plus the
two values the chart refuses to render without) and a production-like values file. Each is
rendered once per module; checkov runs once per values file (it takes seconds).

Modelled on Apache Airflow's chart tests: render with Helm, then assert fields with pytest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.contract.helm import checkov_scan
from tests.contract.helm.chart import (
    KEK,
    KUBERNETES_VERSION,
    MINIMAL,
    NAMESPACE,
    Manifest,
    by_kind,
    containers,
    env,
    manifests,
    one,
    pod_metadata,
    pod_spec,
    render,
    values_file,
    workloads,
)

VALUES = {"defaults": MINIMAL, "production": values_file("values-production.yaml")}
JOB_COMMANDS = {
    "memgate-consolidate": ["memgate", "jobs", "run", "memory.consolidate"],
    "memgate-sweep-expired": ["memgate", "jobs", "run", "memory.sweep_expired"],
    "memgate-age-unused": ["memgate", "jobs", "run", "memory.age_unused"],
    "memgate-audit-checkpoint": ["memgate", "audit", "checkpoint"],
    "memgate-key-rotation": ["memgate", "keys", "rotate"],
}
SECRET_ENV = (
    "DATABASE_URL",
    "MEMGATE_MIGRATION_DATABASE_URL",
    "MEMGATE_KEY_ENCRYPTION_KEY",
    "MEMGATE_EMBEDDING_API_KEY",
    "MEMGATE_SUMMARIZER_API_KEY",
    "MEMGATE_READ_DATABASE_URL",
    "MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID",
    "MEMGATE_BOOTSTRAP_ADMIN_SECRET",
)
BOOTSTRAP_ENV = {
    "MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID": "bootstrap-admin-client-id",
    "MEMGATE_BOOTSTRAP_ADMIN_SECRET": "bootstrap-admin-secret",
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    return {name: manifests(render(values)) for name, values in VALUES.items()}


@pytest.fixture(scope="module", params=sorted(VALUES))
def case(
    request: pytest.FixtureRequest, rendered: dict[str, list[Manifest]]
) -> tuple[str, list[Manifest]]:
    name = str(request.param)
    return name, rendered[name]


@pytest.fixture(scope="module")
def docs(case: tuple[str, list[Manifest]]) -> list[Manifest]:
    return case[1]


def test_the_manifest_kinds(case: tuple[str, list[Manifest]]) -> None:
    name, docs = case
    kinds = sorted({doc["kind"] for doc in docs})
    expected = {
        "ConfigMap",
        "CronJob",
        "Deployment",
        "Job",
        "NetworkPolicy",
        "Pod",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    }
    if name == "defaults":
        assert kinds == sorted({*expected, "Secret"})
    else:
        # an existing Secret: the chart makes none; Ingress and HPA are on
        assert kinds == sorted({*expected, "HorizontalPodAutoscaler", "Ingress"})
    assert all(doc["metadata"]["namespace"] == NAMESPACE for doc in docs)


def test_every_manifest_is_valid_for_kubernetes(docs: list[Manifest]) -> None:
    for doc in docs:
        # strict: an unknown field (a typo) fails too
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_pod_runs_restricted(docs: list[Manifest]) -> None:
    pods = list(workloads(docs))
    assert len(pods) >= 7
    for doc in pods:
        spec = pod_spec(doc)
        assert spec["automountServiceAccountToken"] is False, doc["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in spec
        assert "hostPID" not in spec
        for container in containers(doc):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["runAsUser"] == 10001
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["privileged"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert set(container["resources"]) == {"requests", "limits"}


def test_memgate_pods_write_only_to_their_empty_dirs(docs: list[Manifest]) -> None:
    for doc in workloads(docs):
        if doc["kind"] == "Pod":
            continue  # the helm test pod writes nothing
        spec = pod_spec(doc)
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert set(volumes) == {"tmp", "data"}
        assert all(set(v) == {"name", "emptyDir"} for v in volumes.values())
        for container in containers(doc):
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts == {"/tmp": "tmp", "/data": "data"}  # noqa: S108 (emptyDir mounts)


def test_the_service_account_mounts_no_token(docs: list[Manifest]) -> None:
    account = one(docs, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    for doc in workloads(docs):
        assert pod_spec(doc)["serviceAccountName"] == account["metadata"]["name"]


def test_api_pods_serve_without_migrating_behind_probes(docs: list[Manifest]) -> None:
    deployment = one(docs, "Deployment")
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    assert container["command"][:3] == ["memgate", "serve", "--no-migrate"]
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    # the drain (uvicorn's workers get 30 s) fits in the grace period after the preStop sleep
    assert spec["terminationGracePeriodSeconds"] >= sleep + 30
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # no API pod gets the owner's URL: it logs in as the app's role only
    assert "MEMGATE_MIGRATION_DATABASE_URL" not in env(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9464}


def test_config_and_secret_changes_roll_the_pods(case: tuple[str, list[Manifest]]) -> None:
    name, docs = case
    annotations = pod_metadata(one(docs, "Deployment"))["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/secret"])
    changed = {**VALUES[name], "config": {**VALUES[name].get("config", {}), "tokenTtlSeconds": 300}}
    again = pod_metadata(one(manifests(render(changed)), "Deployment"))["annotations"]
    assert again["checksum/config"] != annotations["checksum/config"]
    assert again["checksum/secret"] == annotations["checksum/secret"]


def test_topology_spread_and_disruption_budget(docs: list[Manifest]) -> None:
    spec = pod_spec(one(docs, "Deployment"))
    keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    for constraint in spec["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"] == selector
    assert one(docs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": selector},
    }


def test_secrets_are_never_inline_in_env(docs: list[Manifest]) -> None:
    for doc in workloads(docs):
        for container in containers(doc):
            variables = env(container)
            for name in SECRET_ENV:
                if name in variables:
                    assert set(variables[name]) == {"name", "valueFrom"}, name
                    assert "secretKeyRef" in variables[name]["valueFrom"]
            for item in variables.values():
                value = str(item.get("value", ""))
                assert "postgresql://" not in value, item["name"]
                assert KEK not in value
    for config in by_kind(docs, "ConfigMap"):
        text = json.dumps(config["data"])
        assert "postgresql://" not in text
        assert KEK not in text
        assert not any(name in config["data"] for name in SECRET_ENV)


def test_the_migration_job_is_a_hook_run_as_the_owner(docs: list[Manifest]) -> None:
    job = one(docs, "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    (container,) = pod_spec(job)["containers"]
    assert container["command"] == ["memgate", "migrate"]
    owner = env(container)["MEMGATE_MIGRATION_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert owner["key"] == "migration-database-url"
    assert env(container)["MEMGATE_KEY_ENCRYPTION_KEY"]["valueFrom"]["secretKeyRef"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    # the hook runs before the ConfigMap exists: the settings `migrate` reads come inline
    assert env(container)["MEMGATE_EMBEDDED_ISSUER"]["value"] == "true"
    assert "envFrom" not in container


def test_the_migration_hook_gets_the_extra_settings(rendered: dict[str, list[Manifest]]) -> None:
    (container,) = pod_spec(one(rendered["production"], "Job"))["containers"]
    assert env(container)["MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_SOURCE"]["value"] == "16"


def test_a_chart_made_secret_exists_before_the_migration_hook_and_none_outlives_the_release(
    rendered: dict[str, list[Manifest]],
) -> None:
    """The pods read an ordinary release object (`helm uninstall` removes it); the hook reads
    a copy made just before it and deleted once the hooks succeeded. The one Secret used to
    be a hook with before-hook-creation only: hooks are no release objects, so uninstall left
    the database passwords and the key-encryption key in the namespace."""
    docs = rendered["defaults"]
    assert by_kind(rendered["production"], "Secret") == []  # an existing Secret: none made
    release = one(docs, "Secret", "memgate-secrets")
    assert not any(k.startswith("helm.sh/") for k in release["metadata"].get("annotations") or {})
    hook = one(docs, "Secret", "memgate-secrets-hook")
    annotations = hook["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert hook["stringData"] == release["stringData"]
    job = one(docs, "Job")
    assert int(annotations["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    for doc in workloads(docs):
        wanted = "memgate-secrets-hook" if doc is job else "memgate-secrets"
        for container in containers(doc):
            for item in env(container).values():
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] == wanted, (doc["metadata"]["name"], item["name"])


def test_argo_cd_users_get_a_plain_job_or_none() -> None:
    plain = manifests(render({**MINIMAL, "migrations": {"asHook": False}}))
    job = one(plain, "Job", "memgate-migrate")
    assert not any(key.startswith("helm.sh/hook") for key in job["metadata"]["annotations"])
    assert job["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "-1"
    assert "helm.sh/hook" not in (one(plain, "Secret")["metadata"].get("annotations") or {})
    assert by_kind(manifests(render({**MINIMAL, "migrations": {"enabled": False}})), "Job") == []


def test_cron_jobs_forbid_overlap_and_run_the_documented_commands(
    case: tuple[str, list[Manifest]],
) -> None:
    name, docs = case
    cron = {doc["metadata"]["name"]: doc for doc in by_kind(docs, "CronJob")}
    expected = dict(JOB_COMMANDS)
    if name == "production":
        expected["memgate-audit-key-rotation"] = ["memgate", "keys", "rotate-audit"]
    assert {n: pod_spec(d)["containers"][0]["command"] for n, d in cron.items()} == expected
    for doc in cron.values():
        assert doc["spec"]["concurrencyPolicy"] == "Forbid"
        (container,) = pod_spec(doc)["containers"]
        owner = "MEMGATE_MIGRATION_DATABASE_URL" in env(container)
        # only key rotation works as the tables' owner (docs/jobs.md, "Platform jobs")
        assert owner == (container["command"][1] == "keys")


def test_cron_jobs_can_be_turned_off_one_by_one() -> None:
    values = {**MINIMAL, "cronJobs": {"consolidate": {"enabled": False, "schedule": "0 * * * *"}}}
    names = {doc["metadata"]["name"] for doc in by_kind(manifests(render(values)), "CronJob")}
    assert names == set(JOB_COMMANDS) - {"memgate-consolidate"}
    no_issuer = {**MINIMAL, "config": {"embeddedIssuer": False}}
    names = {doc["metadata"]["name"] for doc in by_kind(manifests(render(no_issuer)), "CronJob")}
    assert "memgate-key-rotation" not in names


def test_api_pods_leave_the_jobs_to_the_cron_jobs(docs: list[Manifest]) -> None:
    data = one(docs, "ConfigMap")["data"]
    assert data["MEMGATE_AUDIT_CHECKPOINT_SECONDS"] == "0"  # the CronJob signs
    assert data["MEMGATE_JOBS_SCHEDULE"] == ""  # the CronJobs schedule
    assert data["MEMGATE_ALLOW_PLAIN_HTTP"] == "1"  # TLS ends at the Ingress
    assert data["MEMGATE_METRICS_HOST"] == "0.0.0.0"  # noqa: S104 (the pod's scrape listener)
    assert data["MEMGATE_DATA_DIR"] == "/data"
    without = manifests(
        render(
            {
                **MINIMAL,
                "cronJobs": {"auditCheckpoint": {"enabled": False, "schedule": "* * * * *"}},
            }
        )
    )
    assert one(without, "ConfigMap")["data"]["MEMGATE_AUDIT_CHECKPOINT_SECONDS"] == "300"


def test_the_data_key_store_is_a_value(docs: list[Manifest]) -> None:
    """Crypto-shredding's key store: `file` by default (the server then refuses the setting on
    Kubernetes), a KMS plug point when named; anything else fails the values schema."""
    assert one(docs, "ConfigMap")["data"]["MEMGATE_DATA_KEY_STORE"] == "file"
    kms = {**MINIMAL, "config": {"dataKeyStore": "acme_kms.memgate:store"}}
    rendered = one(manifests(render(kms)), "ConfigMap")["data"]
    assert rendered["MEMGATE_DATA_KEY_STORE"] == "acme_kms.memgate:store"
    with pytest.raises(helm.HelmValuesError, match="dataKeyStore"):
        render({**MINIMAL, "config": {"dataKeyStore": "kms; rm -rf /"}})


def test_the_schema_docs_are_off_unless_asked_for(docs: list[Manifest]) -> None:
    """Issue 18, misconfiguration: a deployment serves no /schema unless the operator asks."""
    assert one(docs, "ConfigMap")["data"]["MEMGATE_SCHEMA_DOCS"] == "0"
    portal = {**MINIMAL, "config": {"schemaDocs": True}}
    assert one(manifests(render(portal)), "ConfigMap")["data"]["MEMGATE_SCHEMA_DOCS"] == "1"
    with pytest.raises(helm.HelmValuesError, match="schemaDocs"):
        render({**MINIMAL, "config": {"schemaDocs": "yes"}})


def test_prepared_statements_can_be_turned_off_for_a_pooler(docs: list[Manifest]) -> None:
    """On by default; `config.dbPreparedStatements: false` for a transaction-mode pooler."""
    assert one(docs, "ConfigMap")["data"]["MEMGATE_DB_PREPARED_STATEMENTS"] == "1"
    pooled = {**MINIMAL, "config": {"dbPreparedStatements": False}}
    rendered = one(manifests(render(pooled)), "ConfigMap")["data"]
    assert rendered["MEMGATE_DB_PREPARED_STATEMENTS"] == "0"
    with pytest.raises(helm.HelmValuesError, match="dbPreparedStatements"):
        render({**MINIMAL, "config": {"dbPreparedStatements": "sometimes"}})


def test_network_policies_admit_only_the_ingress_controller(
    case: tuple[str, list[Manifest]],
) -> None:
    name, docs = case
    policies = {doc["metadata"]["name"]: doc["spec"] for doc in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"memgate-api", "memgate-jobs"}
    api = policies["memgate-api"]
    assert api["policyTypes"] == ["Ingress", "Egress"]
    http_rule, metrics_rule = api["ingress"]
    controller = http_rule["from"][0]
    assert controller["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ingress-nginx"
    }
    assert controller["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "ingress-nginx"}
    assert http_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert policies["memgate-jobs"]["ingress"] == []
    egress_ports = [sorted(p["port"] for p in rule["ports"]) for rule in api["egress"]]
    assert egress_ports[0] == [53, 53]  # DNS, UDP and TCP
    if name == "production":
        cidrs = {
            block["ipBlock"]["cidr"]
            for rule in api["egress"]
            for block in rule["to"]
            if "ipBlock" in block
        }
        assert cidrs == {"10.20.0.0/24", "198.51.100.10/32", "10.30.0.0/24", "10.40.0.0/16"}
        assert policies["memgate-jobs"]["egress"] == api["egress"]


def test_production_ingress_terminates_tls_and_pins_the_image(
    rendered: dict[str, list[Manifest]],
) -> None:
    docs = rendered["production"]
    ingress = one(docs, "Ingress")["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["tls"] == [
        {"hosts": ["memory.example.com"], "secretName": "memory-example-com-tls"}
    ]
    data = one(docs, "ConfigMap")["data"]
    assert data["MEMGATE_PUBLIC_URL"] == "https://memory.example.com"
    assert (
        json.loads(data["MEMGATE_EXTERNAL_ISSUERS"])[0]["issuer"]
        == "https://sso.example.com/realms/agents"
    )
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4318"
    for doc in workloads(docs):
        if doc["kind"] != "Pod":
            image = containers(doc)[0]["image"]
            assert image.startswith("registry.example.com/platform/memgate:0.1.0@sha256:")
    assert "replicas" not in one(docs, "Deployment")["spec"]  # the autoscaler owns it
    assert one(docs, "HorizontalPodAutoscaler")["spec"]["minReplicas"] == 3


def test_the_helm_test_pod_hits_readyz(docs: list[Manifest]) -> None:
    pod = one(docs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["containers"][0]["command"][-1] == "http://memgate:8080/readyz"


def test_the_metrics_service_is_separate_from_the_api(docs: list[Manifest]) -> None:
    services = {doc["metadata"]["name"]: doc["spec"] for doc in by_kind(docs, "Service")}
    assert services["memgate"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert services["memgate-metrics"]["ports"] == [
        {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"secrets": {"databaseUrl": "postgresql://a@b/c"}}, "a key-encryption key is required"),
        ({"secrets": {"keyEncryptionKey": KEK}}, "secrets.databaseUrl"),
    ],
)
def test_rendering_fails_without_a_key_encryption_key_or_database(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


def test_the_platform_admin_credentials_come_from_the_secret_the_operator_reads() -> None:
    """The migration Job bootstraps the platform admin into a data dir that dies with its pod:
    the id and secret must be the operator's, from the release's Secret, and NOTES.txt must
    send the operator there, not to a pod's /data."""
    rendered = render(MINIMAL)
    docs = manifests(rendered)
    secret = one(docs, "Secret", "memgate-secrets")
    assert (
        secret["stringData"]["bootstrap-admin-client-id"]
        == (MINIMAL["secrets"]["bootstrapAdminClientId"])
    )
    assert (
        secret["stringData"]["bootstrap-admin-secret"] == MINIMAL["secrets"]["bootstrapAdminSecret"]
    )
    job = one(docs, "Job")
    (container,) = containers(job)
    for name, key in BOOTSTRAP_ENV.items():
        assert env(container)[name]["valueFrom"]["secretKeyRef"] == {
            "name": "memgate-secrets-hook",  # the hook's copy of memgate-secrets
            "key": key,
        }
    # only the pod that bootstraps holds the admin's secret
    for doc in workloads(docs):
        if doc is not job:
            for other in containers(doc):
                assert not set(BOOTSTRAP_ENV) & set(env(other)), doc["metadata"]["name"]
    notes = rendered["memgate/templates/NOTES.txt"]
    assert "/data/admin-client.secret" not in notes
    assert "get secret memgate-secrets -o jsonpath='{.data.bootstrap-admin-secret}'" in notes
    without = {k: v for k, v in MINIMAL["secrets"].items() if not k.startswith("bootstrap")}
    with pytest.raises(helm.HelmRenderError, match="the platform admin's credentials"):
        render({"secrets": without})
    with pytest.raises(helm.HelmValuesError, match="bootstrapAdminSecret"):
        render({"secrets": {**MINIMAL["secrets"], "bootstrapAdminSecret": "short"}})


def test_unknown_and_unsafe_values_are_refused() -> None:
    with pytest.raises(helm.HelmValuesError, match="additional properties 'replicas' not allowed"):
        render({**MINIMAL, "replicas": 3})
    with pytest.raises(helm.HelmValuesError, match="readOnlyRootFilesystem"):
        render({**MINIMAL, "containerSecurityContext": {"readOnlyRootFilesystem": False}})
    with pytest.raises(helm.HelmValuesError, match="keyEncryptionKey"):
        render({"secrets": {**MINIMAL["secrets"], "keyEncryptionKey": "too short"}})
    # an existing Secret must name the key-encryption key's entry
    with pytest.raises(helm.HelmValuesError, match="/secrets/keys/keyEncryptionKey"):
        render({"secrets": {"existingSecret": "s", "keys": {"keyEncryptionKey": ""}}})


def test_helm_lint_is_clean() -> None:
    report = helm.lint(
        str(Path(__file__).resolve().parents[3] / "helm" / "memgate"), MINIMAL, strict=True
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.fixture(scope="module")
def checkov_report(
    case: tuple[str, list[Manifest]], tmp_path_factory: pytest.TempPathFactory
) -> checkov_scan.Report:
    name, docs = case
    return checkov_scan.scan(docs, tmp_path_factory.mktemp(f"checkov-{name}"))


def test_checkov_finds_nothing_beyond_the_justified_skips(
    checkov_report: checkov_scan.Report,
) -> None:
    assert checkov_report.failed == []
    assert checkov_report.passed > 100
    for check_id, resource, reason in checkov_report.skipped:
        assert check_id in checkov_scan.JUSTIFIED, (check_id, resource)
        assert len(reason) > 30, (check_id, resource)  # a reason, not a bare id


def test_checkov_skips_the_digest_check_only_without_a_digest(
    case: tuple[str, list[Manifest]], checkov_report: checkov_scan.Report
) -> None:
    name, _ = case
    digest_skips = [
        s for s in checkov_report.skipped if s[0] == "CKV_K8S_43" and "test-readyz" not in s[1]
    ]
    assert (digest_skips == []) == (name == "production")


def test_an_upgrade_renders_the_same_objects(rendered: dict[str, list[Manifest]]) -> None:
    upgrade = manifests(render(MINIMAL, is_upgrade=True))
    assert sorted((d["kind"], d["metadata"]["name"]) for d in upgrade) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in rendered["defaults"]
    )


OPTIONAL_WITHOUT_DEFAULT = {
    ".podSecurityContext.seccompProfile.localhostProfile",
    ".containerSecurityContext.seccompProfile.localhostProfile",
    ".containerSecurityContext.capabilities.add",  # typed only to be refused (maxItems 0)
}
"""Keys the schema types for users who set them, with no default in values.yaml."""


def _schema_keys(schema: dict[str, Any], values: dict[str, Any], path: str) -> Iterator[str]:
    """Paths where values.yaml and values.schema.json name different keys."""
    properties = schema.get("properties")
    if properties is None or schema.get("additionalProperties") is not False:
        return
    documented = set(properties) - {"global"}  # Helm's umbrella-chart key, no default
    for key in documented ^ set(values):
        if f"{path}.{key}" not in OPTIONAL_WITHOUT_DEFAULT:
            yield f"{path}.{key}"
    for key in documented & set(values):
        if isinstance(values[key], dict):
            yield from _schema_keys(properties[key], values[key], f"{path}.{key}")


def test_the_schema_and_the_documented_defaults_name_the_same_keys() -> None:
    chart = Path(__file__).resolve().parents[3] / "helm" / "memgate"
    schema = json.loads((chart / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    assert list(_schema_keys(schema, defaults, "")) == []
    assert _undocumented((chart / "values.yaml").read_text()) == []


def _undocumented(text: str) -> list[str]:
    """Values in values.yaml with no `#` comment: above the key, above a group it belongs to,
    or above a run of sibling keys it continues (e.g. the two history limits)."""
    undocumented: list[str] = []
    documented: dict[int, bool] = {}  # indentation -> the current run there has a comment
    commented = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            commented = False
            documented = {depth: known for depth, known in documented.items() if depth == 0}
            documented[0] = False
            continue
        if stripped.startswith("#"):
            commented = True
            continue
        key = re.match(r"^( *)([A-Za-z]\w*):", line)
        if key is None:
            continue  # a list item or a continuation: part of the value above
        depth = len(key.group(1))
        inherited = any(known for d, known in documented.items() if d < depth)
        ok = commented or "#" in line or documented.get(depth, False) or inherited
        documented = {d: known for d, known in documented.items() if d < depth}
        documented[depth] = ok
        if not ok and not stripped.endswith(":"):  # a group is documented by its keys
            undocumented.append(stripped)
        commented = False
    return undocumented


def _api_env(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return env(containers(one(manifests(render(values)), "Deployment"))[0])


def test_a_read_replica_url_comes_from_a_secret_entry() -> None:
    assert "MEMGATE_READ_DATABASE_URL" not in _api_env(MINIMAL)  # off by default
    standby = "postgresql://memgate_api:dev@postgres-ro:5432/memgate"
    docs = manifests(render(MINIMAL | {"postgresql": {"readReplicaUrl": standby}}))
    read = env(containers(one(docs, "Deployment"))[0])["MEMGATE_READ_DATABASE_URL"]
    assert read == {
        "name": "MEMGATE_READ_DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "memgate-secrets", "key": "read-database-url"}},
    }
    assert one(docs, "Secret", "memgate-secrets")["stringData"]["read-database-url"] == standby
    config = one(docs, "ConfigMap", "memgate")["data"]
    assert config["MEMGATE_READ_REPLICA_MAX_LAG_MS"] == "250"
    existing = {
        "secrets": {"existingSecret": "db", "keys": {"keyEncryptionKey": "kek"}},
        "postgresql": {"readReplicaFromExistingSecret": True, "readReplicaMaxLagMs": 500},
    }
    read = _api_env(existing)["MEMGATE_READ_DATABASE_URL"]
    assert read["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "read-database-url"}
