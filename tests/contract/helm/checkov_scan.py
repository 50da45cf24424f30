"""checkov over the rendered manifests, as a library (no network: its Kubernetes checks are
local; nothing is uploaded without an API key)."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

JUSTIFIED = {
    # memgate reads its settings, secrets included, from the environment only
    # (service/settings.py); the chart passes them by secretKeyRef, never inline.
    "CKV_K8S_35",
    # image by digest: skipped only while image.digest is unset (production values pin it), and
    # on the helm test pod's public busybox image.
    "CKV_K8S_43",
    # the helm test pod is a one-shot wget: nothing to probe for liveness or readiness.
    "CKV_K8S_8",
    "CKV_K8S_9",
}
"""Every check the chart skips, each through a `checkov.io/skipN: ID=reason` annotation in its
template (helm/memgate/templates)."""


@dataclass(frozen=True)
class Report:
    passed: int
    failed: list[tuple[str, str, str]]
    """(check id, resource, check name) of each failed check."""
    skipped: list[tuple[str, str, str]]
    """(check id, resource, the template's reason) of each skipped check."""


def scan(docs: list[dict[str, Any]], folder: Path) -> Report:
    """Run checkov on `docs`, leaving the process as it found it: checkov adds a handler to the
    root logger and changes the warning filters, which later tests in this worker must not see."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    environment = dict(os.environ)
    # No update checks, no guideline downloads, no platform calls.
    os.environ.update(CHECKOV_SKIP_VERSION_CHECK="1", BC_SKIP_MAPPING="TRUE")
    with warnings.catch_warnings():
        try:
            return _scan(docs, folder)
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
            os.environ.clear()
            os.environ.update(environment)


def _scan(docs: list[dict[str, Any]], folder: Path) -> Report:
    from checkov.kubernetes.runner import Runner
    from checkov.runner_filter import RunnerFilter

    for index, doc in enumerate(docs):
        (folder / f"{index:03d}-{doc['kind'].lower()}.yaml").write_text(yaml.safe_dump(doc))
    found = Runner().run(
        root_folder=str(folder), runner_filter=RunnerFilter(framework=["kubernetes"])
    )
    # one runner over one folder answers one report (a list only from several frameworks)
    (report,) = found if isinstance(found, list) else [found]
    return Report(
        passed=len(report.passed_checks),
        failed=[(c.check_id, c.resource, c.check_name) for c in report.failed_checks],
        skipped=[
            (c.check_id, c.resource, str(c.check_result.get("suppress_comment", "")))
            for c in report.skipped_checks
        ],
    )
