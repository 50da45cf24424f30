"""How a job is declared, and what each of its batches is handed.

A job is an operation (`memory.consolidate`, declared in its feature's `operations.py` with the
`run:jobs` scope) plus a batch function. The runner (service/jobs/runner.py) opens one `Call` per
batch, run as the tenant's job principal (with the grants it held when the run was enqueued ∩ the
grants it holds now), hands the batch its cursor, and commits what the batch did together with
the run's new cursor and the batch's audit row. A batch therefore never commits, never loops over
the whole tenant, and is safe to repeat: a batch killed half-way is rolled back and run again
from the same cursor.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from service.auth.principal import Principal
from service.calls import Call
from service.operations import Operation
from service.runtime import Runtime


@dataclass(frozen=True)
class RunScope:
    """What one run covers: a tenant, optionally one space, and whether it only counts."""

    tenant_id: uuid.UUID
    space_id: uuid.UUID | None = None
    dry_run: bool = False
    options: Mapping[str, str] = field(default_factory=dict)
    """Job-specific options (`subject` for a consolidation asked for one subject)."""


@dataclass
class Batch:
    """One bounded batch of a run, inside its own call (its session is `call.db`)."""

    call: Call
    principal: Principal
    """The job principal the batch runs as; every read goes through `Visible(principal, …)`."""
    runtime: Runtime
    scope: RunScope
    cursor: str | None
    """Where the previous batch of this run stopped (None: the run's first batch)."""
    size: int
    """Handle at most this many items."""


@dataclass(frozen=True)
class BatchDone:
    counts: Mapping[str, int]
    """What the batch did (`summaries_written`, `deleted` …), summed into the run's counts and
    noted on the batch's audit row."""
    cursor: str | None
    """Where the next batch starts; None when the run is finished."""


@dataclass(frozen=True)
class Job:
    operation: Operation
    """Its name is the job's name and the audit action of each batch."""
    run_batch: Callable[[Batch], Awaitable[BatchDone]]
    needs: frozenset[str] = frozenset({"read"})
    """The policy actions (`read`, `write`, `delete`) the job principal must hold somewhere for
    the run to do anything; without them the run ends at once, saying so."""
    options: frozenset[str] = frozenset()
    """The option names a run of the job may carry (`subject`); a run asking for any other is
    refused (422) before it is queued."""

    @property
    def name(self) -> str:
        return self.operation.name
