"""Render helm/memgate with Helm's own Go SDK (the helm-python-sdk wheel: libhelm over ctypes,
no helm binary, no cluster) and walk the manifests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "memgate"
HERE = Path(__file__).resolve().parent
RELEASE = "memgate"
NAMESPACE = "memgate"
KUBERNETES_VERSION = "1.32.0"
"""Schemas of this version ship inside kubernetes-validate (no download)."""

KEK = "q8l1TjYk0m3kE6wqJ1cXz2pN5vR8tB4yH7uA0sD3fG6"
MINIMAL: dict[str, Any] = {
    "secrets": {
        "keyEncryptionKey": KEK,
        "databaseUrl": "postgresql://memgate_api:dev@postgres:5432/memgate",
        "migrationDatabaseUrl": "postgresql://memgate:dev@postgres:5432/memgate",
        "bootstrapAdminClientId": "6f1c2a9e-4b1d-4c8e-9a51-3d2f7b8e0c14",
        "bootstrapAdminSecret": "dev-only-bootstrap-admin-secret-0123456789",
    }
}
"""The chart's defaults plus the values it refuses to render without."""

POD_KINDS = ("Deployment", "Job", "CronJob", "Pod")

Manifest = dict[str, Any]


def values_file(name: str) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((HERE / name).read_text()))


def render(values: dict[str, Any], *, is_upgrade: bool = False) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would (schema checked first)."""
    chart = helm.Chart.load(CHART)
    try:
        chart.validate_schema(values)
        return chart.render(
            values,
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=not is_upgrade,
            is_upgrade=is_upgrade,
        )
    finally:
        chart.close()


def manifests(rendered: dict[str, str]) -> list[Manifest]:
    return [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def pod_spec(doc: Manifest) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "Pod":
        return cast(dict[str, Any], spec)
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return cast(dict[str, Any], spec["template"]["spec"])


def pod_metadata(doc: Manifest) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return cast(dict[str, Any], spec["template"]["metadata"])


def workloads(docs: list[Manifest]) -> Iterator[Manifest]:
    yield from (doc for doc in docs if doc["kind"] in POD_KINDS)


def containers(doc: Manifest) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec["containers"]]


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}
