"""The memory operations: learn, recall, forget. Served as REST routes and MCP tools."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.embeddings.base import EmbeddingFailed, EmbeddingInvalid
from service.erasure.problems import ContentErased
from service.memory.problems import (
    BatchRejected,
    ContentRevoked,
    EvidenceRequired,
    KeyChoiceRequired,
    KOutOfRange,
    MemoryNotFound,
    NotAProposal,
    NotAReviewer,
    NoWritableSpace,
    ProposalRejected,
    ReadTooBroad,
    ReservedForJobs,
    SearchTooBroad,
    SpaceNotFound,
    SpaceReadOnly,
    ValueTooLong,
    VersionRetracted,
)
from service.operations import operation
from service.problems import BadCursor
from service.quotas.problems import QuotaExceeded

WRITE = operation(
    "memory.write",
    "writeMemory",
    "Write a memory (supersedes the live one with the same subject, kind and key)",
    Scope.WRITE_MEMORY,
    ValueTooLong,
    QuotaExceeded,
    MemoryNotFound,
    SpaceNotFound,
    SpaceReadOnly,
    NoWritableSpace,
    EmbeddingInvalid,
    EmbeddingFailed,
    KeyChoiceRequired,
    EvidenceRequired,
    ReservedForJobs,
    ProposalRejected,
    ContentRevoked,
    ContentErased,
    success=201,
    idempotent=True,
    conditional=True,
)
WRITE_BATCH = operation(
    "memory.write_batch",
    "writeMemoryBatch",
    "Write up to MEMGATE_BATCH_MAX_ITEMS memories in one transaction, all or none",
    Scope.WRITE_MEMORY,
    BatchRejected,
    QuotaExceeded,
    EmbeddingInvalid,
    EmbeddingFailed,
    success=201,
    idempotent=True,
)
LIST = operation(
    "memory.list",
    "listMemories",
    "List the live memories visible to you, newest first",
    Scope.READ_MEMORY,
    BadCursor,
    SpaceNotFound,
    ReadTooBroad,
    read_only=True,
)
COUNT = operation(
    "memory.count",
    "countMemories",
    "Count the live memories visible to you, optionally grouped",
    Scope.READ_MEMORY,
    SpaceNotFound,
    ReadTooBroad,
    read_only=True,
)
SEARCH = operation(
    "memory.search",
    "searchMemories",
    "Rank the live memories visible to you by similarity to a query",
    Scope.READ_MEMORY,
    KOutOfRange,
    SpaceNotFound,
    SearchTooBroad,
    EmbeddingInvalid,
    EmbeddingFailed,
    read_only=True,
)
GET = operation(
    "memory.get",
    "getMemory",
    "Get one memory by id",
    Scope.READ_MEMORY,
    MemoryNotFound,
    ReadTooBroad,
    read_only=True,
)
DELETE = operation(
    "memory.delete",
    "deleteMemory",
    "Delete (retract) one memory version; its number stays in the history as a stub",
    Scope.DELETE_MEMORY,
    MemoryNotFound,
    success=204,
    idempotent=True,
    conditional=True,
)
HISTORY = operation(
    "memory.history",
    "getMemoryHistory",
    "The version chain of a memory, newest first, as far as you can see it",
    Scope.READ_MEMORY,
    MemoryNotFound,
    BadCursor,
    ReadTooBroad,
    read_only=True,
)
REVERT = operation(
    "memory.revert",
    "revertMemory",
    "Write an earlier version's value again as the new live version of its key",
    Scope.WRITE_MEMORY,
    MemoryNotFound,
    VersionRetracted,
    ReservedForJobs,
    EvidenceRequired,
    ReadTooBroad,
    ValueTooLong,
    QuotaExceeded,
    SpaceNotFound,
    SpaceReadOnly,
    NoWritableSpace,
    EmbeddingInvalid,
    EmbeddingFailed,
    ProposalRejected,
    ContentRevoked,
    ContentErased,
    success=201,
    idempotent=True,
    conditional=True,
)

# Review (issue 15): proposals of reviewed spaces, decided by their reviewers.
LIST_PROPOSALS = operation(
    "memory.list_proposals",
    "listProposals",
    "List the proposals waiting for review in a space you review, newest first",
    Scope.REVIEW_MEMORY,
    SpaceNotFound,
    NotAReviewer,
    BadCursor,
    ReadTooBroad,
    read_only=True,
)
APPROVE = operation(
    "memory.approve",
    "approveProposal",
    "Approve a proposal: it becomes the live version of its key, superseding as usual",
    Scope.REVIEW_MEMORY,
    MemoryNotFound,
    NotAReviewer,
    NotAProposal,
    idempotent=True,
    conditional=True,
)
REJECT = operation(
    "memory.reject",
    "rejectProposal",
    "Reject a proposal: it becomes a tombstone, and its text cannot be proposed there again",
    Scope.REVIEW_MEMORY,
    MemoryNotFound,
    NotAReviewer,
    NotAProposal,
    idempotent=True,
    conditional=True,
)

# Jobs (issue 13): run by the job runner as the tenant's job principal, one call per batch.
AGE_UNUSED = operation(
    "memory.age_unused",
    "ageUnusedMemories",
    "Expire the memories neither written nor recalled for their space's max_unused_days",
    Scope.RUN_JOBS,
    BadCursor,
)

SWEEP_EXPIRED = operation(
    "memory.sweep_expired",
    "sweepExpiredMemories",
    "A job: delete memories past their expiry plus the tenant's retention period",
    Scope.RUN_JOBS,
)
