"""Bodies and answers of revoke and reinstate."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

from service.mcp.schemas import MemoryId, MemoryIfMatch

Reason = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=1000,
        description="Why (kept with the revocation, never in the audit log). It may not "
        "quote the memory: 3 or more consecutive words of its value (all of a shorter "
        "value) are refused (422).",
    ),
]


class RevokeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: Reason


class RevokeArguments(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """MCP: the memory and the reason (REST takes the id from the path)."""

    id: MemoryId
    reason: Reason
    if_match: MemoryIfMatch = None


class Revoked(msgspec.Struct, kw_only=True):
    revocation_id: uuid.UUID
    memory_id: uuid.UUID
    revoked_at: datetime
    revoked_by: uuid.UUID
    hidden: int
    """Memories hidden by this revocation now that you can read (the memory, its content-equal
    copies in its space, and every memory derived from one of them, in any space); rows hidden
    already by another revocation count too (they now stay hidden until both are lifted). Rows
    you cannot read are hidden as well but never counted here."""


class Reinstated(msgspec.Struct, kw_only=True):
    revocation_id: uuid.UUID
    memory_id: uuid.UUID
    revoked_at: datetime
    reinstated_at: datetime
    reinstated_by: uuid.UUID
    restored: int
    """Memories visible again that you can read: those this revocation alone hid (rows you
    cannot read come back too, uncounted)."""
