"""Bodies and answers of the erasure API. Answers carry ids, counts and pseudonyms, never
memory content."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from service.memory.schemas import Subject

Name = Annotated[
    str,
    msgspec.Meta(
        min_length=2,
        max_length=200,
        description="A name or alias of the person, for the mention scan (case-insensitive "
        "substring of a memory's value). Cleared from the plan once it is executed.",
    ),
]
Reason = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=1000,
        description="Why (the request's reference, e.g. 'GDPR art. 17 request 2026-114'). It "
        "may not contain a name of the plan (422). It is kept with the plan: no content.",
    ),
]


class ErasureCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: Reason
    subjects: Annotated[list[Subject], msgspec.Meta(max_length=100)] = []
    """Every memory filed under one of these subjects."""
    owners: Annotated[list[uuid.UUID], msgspec.Meta(max_length=100)] = []
    """Every memory these principals wrote, under any subject, in any space."""
    memory_ids: Annotated[list[uuid.UUID], msgspec.Meta(max_length=1000)] = []
    names: Annotated[list[Name], msgspec.Meta(max_length=20)] = []
    """Names and aliases for the mention review list (never erased by the plan)."""
    keep_tombstones: bool = True
    """Keep the erased rows' content hashes so the same text is refused if written again."""
    rewrite: bool = True
    """VACUUM FULL the touched tables after the deletion (the erased bytes leave the files; the
    tables are locked while rewritten). False: a plain VACUUM (the bytes may stay in free space
    until reused, and the proof says so)."""


class ErasureExecute(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    version: Annotated[int, msgspec.Meta(ge=1, description="The plan's version, as reviewed.")]


class Row(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    space_id: uuid.UUID
    version: int


class PlanCounts(msgspec.Struct, kw_only=True):
    by_id: int
    by_subject: int
    by_owner: int
    versions: int
    derived: int
    review: int


class ErasurePlanOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    version: int
    state: Literal["planned", "executed"]
    planned_at: datetime
    subjects: list[str]
    """As asked while planned; their audit pseudonyms once executed."""
    owners: list[str]
    """Principal ids while planned; their audit pseudonyms once executed."""
    memory_ids: list[uuid.UUID]
    names: int
    """How many names the mention scan looks for (the names are never answered)."""
    keep_tombstones: bool
    rewrite: bool
    by_id: list[Row]
    by_subject: list[Row]
    by_owner: list[Row]
    """Rows written by an owner, wherever they were filed (another subject, another space)."""
    versions: list[Row]
    """Other versions of those rows' keys (their supersession chains)."""
    derived: list[Row]
    """Rows derived from any of them (summaries ...), transitively."""
    review: list[Row]
    """Rows outside the erasure whose text mentions a name: for a person to resolve (rewrite
    or erase). They are not erased by this plan."""
    counts: PlanCounts
    truncated: bool = False
    """A list above holds its first 1000 rows only (`counts` counts them all)."""
    executed_at: datetime | None = None
    receipt: str | None = None
    """The signed receipt (a compact JWS) once executed."""


class Receipt(msgspec.Struct, kw_only=True):
    erasure_id: uuid.UUID
    receipt: str
    """A compact JWS (Ed25519) signed with the audit checkpoint key: verify it with
    GET /v1/audit/keys. Its payload is `claims`."""
    claims: dict[str, Any]


class Proof(msgspec.Struct, kw_only=True):
    erasure_id: uuid.UUID
    state: Literal["planned", "executed"]
    checked_at: datetime
    rows_left: int
    """Erased ids still in the memory table (0 once executed)."""
    owned_left: int
    """Memories still written by the plan's owners: now while planned; once executed, as the
    execution left them (the plan keeps no owner id afterwards)."""
    vectors_left: int
    """Vectors still stored for erased ids (0 once executed)."""
    dangling_references: int
    """Live rows whose `derived_from` still names an erased id (0 once executed)."""
    evidence: dict[str, Any]
    """What the execution found, per layer: mentions left, nearest remaining vectors, the
    VACUUM of each touched table, and the byte scan of the database files before and after
    (or why it could not look)."""
