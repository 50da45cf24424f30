"""The API's JSON shapes as TypedDicts: what memgate sends and answers, field for field.

TypedDicts rather than classes: an answer is the parsed JSON itself (no copy, no validation
that could reject a field a newer server adds), and a request is checked by mypy at the call.
No `from __future__ import annotations` here: `Required`/`NotRequired` must be seen at runtime
(`__required_keys__`, which the contract test reads).
Request shapes name exactly the fields of openapi.yaml's request schemas (the contract test,
tests/contract/test_client_contract.py, compares them).
"""

from typing import Any, Literal, NotRequired, Required, TypedDict

Kind = Literal["fact", "preference", "decision", "episode", "summary", "document"]
SearchMode = Literal["hybrid", "vector", "lexical"]
Action = Literal["read", "write", "delete", "review"]
Decision = Literal["allow", "deny", "error"]
GroupBy = Literal["kind", "space", "subject"]
PrincipalKind = Literal["user", "agent", "service"]

# --- requests ---------------------------------------------------------------------------------


class MemoryCreate(TypedDict, total=False):
    """The body of `POST /v1/memories` (and one item of a batch)."""

    subject: Required[str]
    kind: Required[Kind]
    key: Required[str]
    value: Required[str]
    space_id: str | None
    new_key: bool
    on_revoked: Literal["hide", "reject"]
    ttl_seconds: int | None
    valid_from: str | None
    derived_from: list[str]
    source: str | None
    confidence: float | None
    metadata: dict[str, Any] | None


class SearchFilters(TypedDict, total=False):
    subject: str | None
    kind: Kind | None
    key: str | None
    space_id: str | None


class SearchRequest(TypedDict, total=False):
    """The body of `POST /v1/memories/search`."""

    query: Required[str]
    k: int | None
    min_score: float | None
    mode: SearchMode
    filters: SearchFilters | None
    as_of: str | None
    known_at: str | None


class PrincipalCreate(TypedDict, total=False):
    display_name: Required[str]
    kind: PrincipalKind
    external_issuer: str | None
    external_subject: str | None


class ClientCreate(TypedDict, total=False):
    principal_id: Required[str]
    name: Required[str]
    scopes: Required[list[str]]
    kind: Literal["agent", "admin"]


class SpaceCreate(TypedDict, total=False):
    name: Required[str]
    kind: Literal["team", "tenant"]
    parent_id: str | None


class TeamCreate(TypedDict):
    name: str


class RunCreate(TypedDict, total=False):
    """The body of `POST /v1/jobs/{name}/runs`."""

    space_id: str | None
    dry_run: bool
    options: dict[str, str]


class TenantCreate(TypedDict, total=False):
    name: Required[str]
    settings: dict[str, Any] | None


class Limits(TypedDict, total=False):
    """A tenant's or a client's quotas (`PUT /v1/tenants/{id}/limits`; `{}` removes them)."""

    requests_per_second: float | None
    request_burst: int | None
    concurrent_requests: int | None
    token_requests_per_second: float | None
    token_burst: int | None
    embedding_calls_per_minute: int | None
    max_memories: int | None
    max_bytes: int | None


class BatchCreate(TypedDict):
    """The body of `POST /v1/memories:batch`: 1..MEMGATE_BATCH_MAX_ITEMS memory bodies."""

    items: list[MemoryCreate]


# --- answers ----------------------------------------------------------------------------------


class Provenance(TypedDict):
    writer_id: str
    client_id: str
    act: dict[str, Any] | None
    source: str | None
    recorded_at: str
    superseded_at: str | None
    derived_from: list[str]
    derived_from_withheld: int
    read_requires: list[str]
    embedding_model: str


class Memory(TypedDict):
    """`MemoryOut`: one version of a memory."""

    id: str
    space_id: str
    subject: str
    kind: str
    key: str
    value: str
    version: int
    etag: str
    """`"<id>.<version>"`: send it as `If-Match` to change the key only while this version is
    its live one (the server's docs/concepts.md, "Safe retries and edits")."""
    status: Literal["live", "superseded", "expired", "retracted", "proposed", "hidden"]
    valid_from: str
    valid_until: str | None
    expires_at: str | None
    superseded_by: str | None
    supersedes: str | None
    metadata: dict[str, Any]
    provenance: Provenance
    retracted_at: NotRequired[str | None]
    confidence: NotRequired[float | None]


class AudienceNarrowing(TypedDict):
    detail: str
    required_spaces: list[str]
    writer_only: bool


class RevertNote(TypedDict):
    detail: str
    sources_dropped: int


class HiddenNote(TypedDict):
    because: Literal["content-revoked", "derived-from-hidden"]
    detail: str


class MemoryWritten(TypedDict):
    memory: Memory
    superseded: list[str]
    audience_narrowed: NotRequired[AudienceNarrowing | None]
    reverted: NotRequired[RevertNote | None]
    hidden: NotRequired[HiddenNote | None]


class BatchWritten(TypedDict):
    """The answer of a batch: one `MemoryWritten` per item, in order."""

    items: list[MemoryWritten]
    count: int


class MemoryPage(TypedDict):
    items: list[Memory]
    next_cursor: str | None


class SearchHit(TypedDict):
    memory: Memory
    score: float | None
    fused_score: NotRequired[float | None]
    lexical_score: NotRequired[float | None]


class SearchResult(TypedDict):
    hits: list[SearchHit]
    k: int
    min_score: float | None


class CountGroup(TypedDict):
    value: str
    count: int


class MemoryCounts(TypedDict):
    total: int
    group_by: GroupBy | None
    groups: list[CountGroup]
    more_groups: bool


class Principal(TypedDict):
    id: str
    kind: str
    display_name: str
    created_at: str
    disabled_at: str | None
    external_issuer: str | None
    external_subject: str | None
    personal_space_id: str | None


class Client(TypedDict):
    client_id: str
    principal_id: str
    name: str
    kind: str
    scopes: list[str]
    created_at: str
    disabled_at: str | None


class ClientCreated(TypedDict):
    client: Client
    client_secret: str


class SpaceSettings(TypedDict, total=False):
    write_gate: bool
    evidence_gate: bool
    max_unused_days: int | None
    consolidation: dict[str, Any]
    review: bool


class Space(TypedDict):
    id: str
    kind: str
    name: str
    owner_id: str | None
    parent_id: str | None
    settings: SpaceSettings


class SpaceCreated(TypedDict):
    space: Space
    policy_version: int


class SpaceAccess(TypedDict):
    space_id: str
    action: Action
    principal_ids: list[str]
    policy_version: int


class Team(TypedDict):
    id: str
    name: str
    subject: str


class PolicyChange(TypedDict):
    policy_version: int


class RoleGrant(TypedDict):
    principal_id: str
    role: str


class AuditEvent(TypedDict):
    tenant_id: str
    seq: int
    at: str
    action: str
    decision: Decision
    status: int
    reason: str
    route: str
    method: str
    actor: str | None
    client_id: str | None
    delegation: list[str]
    issuer: str | None
    token_id: str | None
    scopes: list[str]
    target_ids: list[str]
    result_count: int | None
    latency_us: int
    policy_version: int | None
    request_id: str
    trace_id: str | None
    prev_hash: str | None
    row_hash: str | None


class AuditPage(TypedDict):
    items: list[AuditEvent]
    next_cursor: str | None


class CheckpointVerdict(TypedDict):
    seq: int
    hash: str
    jws: str
    signature_valid: bool
    matches_chain: bool


class Checkpoint(TypedDict):
    """A signed (tenant, seq, hash) of the audit chain: keep copies."""

    tenant_id: str
    seq: int
    hash: str
    kid: str
    jws: str
    signed_at: str


class AuditReceipt(TypedDict):
    """An `Audit-Receipt`: the seq and hash of a call's own audit row, a head to hold against
    the log later (`verify_audit_head`)."""

    seq: int
    hash: str


class AuditVerification(TypedDict):
    """`VerifyOut`: the chain recomputed over a range."""

    ok: bool
    checked: int
    from_seq: int
    to_seq: int
    head_seq: int
    head_hash: str | None
    first_bad_seq: int | None
    reason: str | None
    checkpoint: CheckpointVerdict | None
    unsigned_checkpoints: list[int]


class AuditExport(TypedDict):
    """An export page: the events (oldest first, parsed from NDJSON) and where to go on."""

    events: list[AuditEvent]
    next_seq: int | None


class RunError(TypedDict):
    slug: str
    detail: str


class JobRun(TypedDict):
    """`RunOut`: one run of a job."""

    id: str
    job: str
    status: Literal["queued", "running", "finished", "failed", "refused"]
    principal_id: str
    space_id: str | None
    dry_run: bool
    options: dict[str, str]
    counts: dict[str, int]
    batches: int
    enqueued_at: str
    enqueued_by: str | None
    started_at: str | None
    heartbeat_at: str | None
    finished_at: str | None
    error: RunError | None


class JobRunPage(TypedDict):
    items: list[JobRun]
    next_cursor: str | None


class Tenant(TypedDict):
    tenant_id: str
    name: str
    is_platform: bool
    settings: dict[str, Any]
    created_at: str
    updated_at: str
    disabled_at: str | None


class TenantAdmin(TypedDict):
    principal_id: str
    client_id: str
    client_secret: str


class TenantCreated(TypedDict):
    tenant: Tenant
    admin: TenantAdmin


class TenantUsage(TypedDict):
    memories: int
    bytes: int


class TenantLimits(TypedDict):
    tenant: Limits
    clients: dict[str, Limits]
    usage: TenantUsage


class TenantPage(TypedDict):
    items: list[Tenant]
    next_cursor: str | None


class TokenResponse(TypedDict):
    access_token: str
    token_type: str
    expires_in: int
    scope: str
    issued_token_type: str


__all__ = [
    "Action",
    "AudienceNarrowing",
    "AuditEvent",
    "AuditExport",
    "AuditPage",
    "AuditReceipt",
    "AuditVerification",
    "BatchCreate",
    "BatchWritten",
    "Checkpoint",
    "CheckpointVerdict",
    "Client",
    "ClientCreate",
    "ClientCreated",
    "CountGroup",
    "Decision",
    "GroupBy",
    "JobRun",
    "JobRunPage",
    "Kind",
    "Limits",
    "Memory",
    "MemoryCounts",
    "MemoryCreate",
    "MemoryPage",
    "MemoryWritten",
    "PolicyChange",
    "Principal",
    "PrincipalCreate",
    "PrincipalKind",
    "Provenance",
    "RevertNote",
    "RoleGrant",
    "RunCreate",
    "RunError",
    "SearchFilters",
    "SearchHit",
    "SearchMode",
    "SearchRequest",
    "SearchResult",
    "Space",
    "SpaceAccess",
    "SpaceCreate",
    "SpaceCreated",
    "SpaceSettings",
    "Team",
    "TeamCreate",
    "Tenant",
    "TenantAdmin",
    "TenantCreate",
    "TenantCreated",
    "TenantLimits",
    "TenantPage",
    "TenantUsage",
    "TokenResponse",
]
