"""The audit operations: read, export and verify the caller's tenant's log (`read:audit` and
the auditor role)."""

from __future__ import annotations

from service.audit.problems import AuditFilterInvalid, AuditorRoleRequired, NoCheckpoint
from service.auth.scopes import Scope
from service.operations import family, operation
from service.policy.guards import requires_auditor
from service.problems import BadCursor

_audit = family(Scope.READ_AUDIT, AuditorRoleRequired, check=requires_auditor)
"""Reading the audit log: `read:audit` and the auditor role."""


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

SIGN_CHECKPOINTS = operation(
    "audit.sign_checkpoints",
    "signAuditCheckpoints",
    "A platform job (`memgate jobs run audit.checkpoint`): sign a checkpoint for every tenant "
    "whose audit chain grew",
    Scope.RUN_JOBS,
)
