"""The erasure operations: plan, re-plan, read, execute and prove (`manage:erasure` and the
eraser role). No MCP tools: erasure is an admin operation over REST and the CLI."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.erasure.problems import (
    EraserRoleRequired,
    ErasureCriteriaEmpty,
    ErasureNotFound,
    ErasurePlanStale,
)
from service.identity.problems import PrincipalNotFound
from service.memory.problems import MemoryNotFound
from service.operations import operation
from service.policy.guards import requires_eraser
from service.revocation.problems import ReasonQuotesContent

ERASURE_PLAN = operation(
    "erasure.plan",
    "planErasure",
    "Plan an erasure (a dry run): what it would erase, and the rows to review",
    Scope.MANAGE_ERASURE,
    EraserRoleRequired,
    ErasureCriteriaEmpty,
    PrincipalNotFound,
    MemoryNotFound,
    ReasonQuotesContent,
    check=requires_eraser,
    success=201,
)
ERASURE_REPLAN = operation(
    "erasure.replan",
    "replanErasure",
    "Plan an erasure again over today's data (its version goes up)",
    Scope.MANAGE_ERASURE,
    EraserRoleRequired,
    ErasureNotFound,
    ErasurePlanStale,
    check=requires_eraser,
)
ERASURE_GET = operation(
    "erasure.get",
    "getErasure",
    "Get an erasure plan (and its receipt once executed)",
    Scope.MANAGE_ERASURE,
    EraserRoleRequired,
    ErasureNotFound,
    check=requires_eraser,
    read_only=True,
)
ERASURE_EXECUTE = operation(
    "erasure.execute",
    "executeErasure",
    "Execute an erasure plan; answers its signed receipt (again, once executed)",
    Scope.MANAGE_ERASURE,
    EraserRoleRequired,
    ErasureNotFound,
    ErasurePlanStale,
    check=requires_eraser,
)
ERASURE_PROOF = operation(
    "erasure.proof",
    "getErasureProof",
    "Check an erasure: rows and vectors left, mentions left, the database files' scan",
    Scope.MANAGE_ERASURE,
    EraserRoleRequired,
    ErasureNotFound,
    check=requires_eraser,
    read_only=True,
)
ERASURE_FINALIZE = operation(
    "erasure.finalize",
    "finalizeErasure",
    "After an execution commits: VACUUM the touched tables and scan the files again (started "
    "by the execute call, no route)",
    Scope.MANAGE_ERASURE,
    takes_input=False,
)
