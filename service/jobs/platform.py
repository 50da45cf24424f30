"""Platform jobs: periodic work of the whole deployment, on the same runner names and CLI.

`audit.checkpoint` signs a checkpoint for every tenant whose audit chain grew (as the app role,
which may insert checkpoints through `audit_checkpoint_insert` only); `keys.rotate` promotes
the published next token signing key (as the tables' owner: the app role may not write keys).
They belong to no tenant and have no cursor: each run is one step, audited in the platform
chain under its dotted operation name with its counts, like a tenant job's batch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from service.audit.checkpoints import run_checkpoints
from service.audit.operations import SIGN_CHECKPOINTS
from service.auth.operations import KEYS_ROTATE
from service.calls import Call
from service.operations import Operation
from service.problems import Problem
from service.runtime import Runtime

Work = Callable[[Runtime, str | None], Awaitable[dict[str, int]]]
"""(runtime, the owner's database URL if this process has it) → counts."""


class OwnerLoginNeeded(Exception):
    """The job writes what only the tables' owner may (signing keys): run it where the owner's
    URL is set (`MEMGATE_MIGRATION_DATABASE_URL`, or the embedded cluster). Not an API problem:
    no route runs platform jobs."""

    slug = "owner-login-needed"


@dataclass(frozen=True)
class PlatformJob:
    name: str
    operation: Operation
    work: Work


async def _checkpoints(runtime: Runtime, _: str | None) -> dict[str, int]:
    return {"signed": await run_checkpoints(runtime.sessionmaker, runtime.kek)}


async def _rotate(runtime: Runtime, owner_url: str | None) -> dict[str, int]:
    if owner_url is None:
        raise OwnerLoginNeeded(
            "keys.rotate writes signing keys, which only the tables' owner may: set "
            "MEMGATE_MIGRATION_DATABASE_URL and run `memgate jobs run keys.rotate`."
        )
    await runtime.rotate_signing_keys(owner_url)
    return {"rotated": 1}


PLATFORM_JOBS: dict[str, PlatformJob] = {
    job.name: job
    for job in (
        PlatformJob("audit.checkpoint", SIGN_CHECKPOINTS, _checkpoints),
        PlatformJob("keys.rotate", KEYS_ROTATE, _rotate),
    )
}


async def run_platform_job(
    runtime: Runtime, job: PlatformJob, owner_url: str | None, via: str = "JOB"
) -> dict[str, int]:
    """One run, audited in the platform chain (allowed with its counts, or failed)."""
    call = Call(runtime, job.operation.name, via, f"/jobs/{job.name}")
    try:
        try:
            counts = await job.work(runtime, owner_url)
        except Problem as problem:
            await call.finish(problem.status, problem.slug)
            raise
        except OwnerLoginNeeded:
            await call.finish(503, OwnerLoginNeeded.slug)
            raise
        except Exception:
            await call.finish(500, "internal-error")
            raise
        call.facts.count(sum(counts.values()))
        call.facts.reason = "ok " + ",".join(f"{k}={v}" for k, v in sorted(counts.items()))
        unrecorded = await call.finish(200)
        if unrecorded is not None:
            raise unrecorded
        return counts
    finally:
        await call.close()
