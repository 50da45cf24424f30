"""The memory operations: learn, recall, forget. Served as REST routes and MCP tools."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.embeddings.base import EmbeddingFailed, EmbeddingInvalid
from service.memory.problems import (
    BatchRejected,
    ContentRevoked,
    EvidenceRequired,
    IdempotencyAnswerGone,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    KeyChoiceRequired,
    KOutOfRange,
    MemoryNotFound,
    NoWritableSpace,
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
    ContentRevoked,
    success=201,
)
WRITE_BATCH = operation(
    "memory.write_batch",
    "writeMemoryBatch",
    "Write up to MEMGATE_BATCH_MAX_ITEMS memories in one transaction, all or none",
    Scope.WRITE_MEMORY,
    BatchRejected,
    IdempotencyKeyReused,
    IdempotencyKeyInFlight,
    IdempotencyAnswerGone,
    QuotaExceeded,
    EmbeddingInvalid,
    EmbeddingFailed,
    success=201,
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
    ContentRevoked,
    success=201,
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
