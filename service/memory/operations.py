"""The memory operations: learn, recall, forget. Served as REST routes and MCP tools."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.embeddings.base import EmbeddingFailed, EmbeddingInvalid
from service.memory.problems import (
    DeleteNeedsWrite,
    EvidenceRequired,
    KeyChoiceRequired,
    KOutOfRange,
    MemoryNotFound,
    NoWritableSpace,
    ReadTooBroad,
    SearchTooBroad,
    SpaceNotFound,
    SpaceReadOnly,
    ValueTooLong,
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
    "Delete one memory",
    Scope.DELETE_MEMORY,
    MemoryNotFound,
    DeleteNeedsWrite,
    success=204,
)
