"""Tool arguments that REST carries in the path or the query string (get, forget, list, counts).

The body-shaped tools (remember, recall) take REST's own request structs. These use the same
field types as REST's query parameters, so the limits and patterns are the same; like every
struct here, unknown fields are refused.
"""

from __future__ import annotations

import uuid
from typing import Annotated

import msgspec

from service.memory.repository import MemoryFilters
from service.memory.review import RejectReason
from service.memory.schemas import AsOf, GroupBy, Key, Kind, KnownAt, MemoryCreate, Subject

MemoryId = Annotated[
    str,
    msgspec.Meta(
        description="The memory's id (a UUID, as returned by remember, recall or list).",
        examples=["0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"],
    ),
]
"""A string, parsed like REST's path id: a malformed one gets REST's `malformed-id` text."""


IfMatch = Annotated[
    str | None,
    msgspec.Meta(
        description="Change only while the live version of the key is this one: its `etag` as "
        'an answer gave it (`"<id>.<version>"`, quotes included), or "*" for "the key has a live '
        'version". Otherwise the tool answers 412 `precondition-failed` naming the current '
        "etag, and nothing changes."
    ),
]
"""REST's `If-Match` header, as a tool argument."""

MemoryIfMatch = Annotated[
    str | None,
    msgspec.Meta(
        description="Change only while this is the memory named: its `etag` as an answer gave "
        'it (`"<id>.<version>"`, quotes included), or "*". Otherwise the tool answers 412 '
        "`precondition-failed` naming the memory's etag, and nothing changes."
    ),
]
"""REST's `If-Match` of a change of one memory that supersedes nothing (reject, revoke,
reinstate), as a tool argument."""


class RememberArguments(MemoryCreate, forbid_unknown_fields=True, kw_only=True):
    """REST's write body, and its `If-Match` header."""

    if_match: IfMatch = None

    def body(self) -> MemoryCreate:
        """The write itself, as REST's body would carry it."""
        fields = {name: getattr(self, name) for name in MemoryCreate.__struct_fields__}
        return MemoryCreate(**fields)


class MemoryChange(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A change of a memory by id (revert, forget), with REST's `If-Match`."""

    id: MemoryId
    if_match: IfMatch = None


class MemoryRef(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A memory by id (approve), with REST's `If-Match` (the live version of its key the
    proposal supersedes)."""

    id: MemoryId
    if_match: IfMatch = None


class RejectArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: MemoryId
    reason: RejectReason
    if_match: MemoryIfMatch = None


class ProposalsArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    space_id: Annotated[str, msgspec.Meta(description="The space whose proposals to list.")]
    cursor: Annotated[
        str | None, msgspec.Meta(description="`next_cursor` of the previous page.")
    ] = None
    limit: Annotated[
        int | None, msgspec.Meta(description="Proposals per page (1-100, default 50).")
    ] = None


class MemoryAt(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A memory by id, optionally as it stood at another time (REST's query parameters)."""

    id: MemoryId
    as_of: AsOf | None = None
    known_at: KnownAt | None = None


class HistoryArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: MemoryId
    cursor: Annotated[
        str | None, msgspec.Meta(description="`next_cursor` of the previous page.")
    ] = None
    limit: Annotated[
        int | None, msgspec.Meta(description="Versions per page (1-100, default 50).")
    ] = None
    as_of: AsOf | None = None
    known_at: KnownAt | None = None


class ListArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    subject: Subject | None = None
    kind: Kind | None = None
    key: Key | None = None
    space_id: uuid.UUID | None = None
    cursor: Annotated[
        str | None, msgspec.Meta(description="`next_cursor` of the previous page.")
    ] = None
    limit: Annotated[int | None, msgspec.Meta(description="Page size (1-100, default 50).")] = None
    as_of: AsOf | None = None
    known_at: KnownAt | None = None

    def filters(self) -> MemoryFilters:
        return MemoryFilters(
            subject=self.subject, kind=self.kind, key=self.key, space_id=self.space_id
        )


class CountArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    subject: Subject | None = None
    kind: Kind | None = None
    key: Key | None = None
    space_id: uuid.UUID | None = None
    group_by: GroupBy | None = None
    as_of: AsOf | None = None
    known_at: KnownAt | None = None

    def filters(self) -> MemoryFilters:
        return MemoryFilters(
            subject=self.subject, kind=self.kind, key=self.key, space_id=self.space_id
        )


class ConsolidationArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A consolidation of one subject (`POST /v1/jobs/memory.consolidate/runs` with
    `options.subject`)."""

    subject: Subject
    space_id: uuid.UUID | None = None
    """Only this space (default: every space the job principal may use)."""
    dry_run: bool = False
    """Count what would be summarized; write nothing."""
