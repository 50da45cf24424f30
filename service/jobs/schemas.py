"""Wire shapes of the job runner API (snake_case JSON; unknown fields are refused)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

OptionName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z_]+$")]
OptionValue = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
RunStatus = Literal["queued", "running", "finished", "failed", "refused"]


class RunCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    space_id: uuid.UUID | None = None
    """Only this space (default: every space the job principal may use)."""
    dry_run: bool = False
    """Count what the job would do; change nothing."""
    options: dict[OptionName, OptionValue] = msgspec.field(default_factory=dict)
    """Job-specific options (`subject` for `memory.consolidate`); others are refused."""


class RunError(msgspec.Struct, kw_only=True):
    slug: str
    """The problem type's slug (`job-grants-missing`, `internal-error` ...)."""
    detail: str
    """What went wrong and what to do; never memory content."""


class RunOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    job: str
    status: RunStatus
    space_id: uuid.UUID | None
    dry_run: bool
    options: dict[str, str]
    counts: dict[str, int]
    """Summed over the run's committed batches."""
    batches: int
    principal_id: uuid.UUID
    """The tenant's job principal the run acts as (grant it with `service:<id>`)."""
    enqueued_by: uuid.UUID | None
    """Who asked (None: the scheduler)."""
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    error: RunError | None


class RunPage(msgspec.Struct, kw_only=True):
    items: list[RunOut]
    next_cursor: str | None
