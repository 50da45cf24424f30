"""Problems of the audit API."""

from __future__ import annotations

from service.problems import Problem


class AuditorRoleRequired(
    Problem, slug="auditor-role-required", status=403, title="Auditor role required"
):
    """Reading or verifying the audit log needs the `read:audit` scope and the auditor role."""


class NoCheckpoint(Problem, slug="no-checkpoint", status=404, title="No checkpoint yet"):
    """The tenant's audit chain has not been checkpointed yet; checkpoints are signed
    periodically (MEMGATE_AUDIT_CHECKPOINT_SECONDS)."""


class AuditFilterInvalid(
    Problem, slug="audit-filter-invalid", status=422, title="Invalid audit filter"
):
    """A filter of the audit log query does not have the documented form."""
