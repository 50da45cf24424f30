"""The audit operations: read, export and verify the caller's tenant's log (`read:audit` and
the auditor role)."""

from __future__ import annotations

from service.audit.problems import AuditFilterInvalid, AuditorRoleRequired, NoCheckpoint
from service.auth.scopes import Scope
from service.operations import Operation, operation
from service.policy.guards import requires_auditor
from service.problems import BadCursor, Problem


def _audit(
    name: str,
    operation_id: str,
    summary: str,
    *problems: type[Problem],
    read_only: bool = False,
) -> Operation:
    return operation(
        name,
        operation_id,
        summary,
        Scope.READ_AUDIT,
        AuditorRoleRequired,
        *problems,
        check=requires_auditor,
        read_only=read_only,
    )


EVENTS = _audit(
    "audit.events", "listAuditEvents", "Your tenant's audit events", AuditFilterInvalid, BadCursor
)
EXPORT = _audit(
    "audit.export", "exportAuditEvents", "Export audit events as NDJSON", read_only=True
)
VERIFY = _audit(
    "audit.verify",
    "verifyAuditChain",
    "Verify your tenant's hash chain",
    AuditFilterInvalid,
    read_only=True,
)
CHECKPOINT = _audit(
    "audit.checkpoint",
    "getLatestCheckpoint",
    "The newest signed checkpoint",
    NoCheckpoint,
    read_only=True,
)
KEYS = _audit(
    "audit.keys", "listAuditKeys", "The public keys that sign audit checkpoints", read_only=True
)
