"""Running a job's batches the way the runner does (one call per batch, as a job principal,
committed with its audit row), until the runner lands on this branch."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from service.auth.principal import Principal
from service.auth.tokens import TrustedIssuer, VerifiedToken
from service.calls import Call
from service.embeddings import Embedder
from service.jobs.declare import Batch, BatchDone, Job, RunScope
from service.problems import Problem
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api


def job_principal(api: Api, principal_id: str | uuid.UUID) -> Principal:
    """The principal a job runs as: `principal_id`'s grants (a random id holds none)."""
    return Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(str(principal_id)),
        client_id="job",
        scopes=frozenset({"run:jobs"}),
        token_id="job",
        issuer="job",
    )


def job_token(runtime: Runtime, principal: Principal) -> VerifiedToken:
    issuer = TrustedIssuer(
        issuer=runtime.issuer.issuer,
        audience=runtime.issuer.audience,
        algorithms=(runtime.settings.auth.signing_alg,),
        keys=runtime.embedded_keys,
        embedded=True,
    )
    return VerifiedToken(
        issuer=issuer,
        tenant_id=principal.tenant_id,
        subject=str(principal.principal_id),
        client_id=principal.client_id,
        scopes=principal.scopes,
        token_id=principal.token_id,
        act=None,
        claims={},
    )


def agent_principal(api: Api, agent: Agent) -> Principal:
    """An agent as a caller of the service layer (reads and writes, no token)."""
    return Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(agent.principal_id),
        client_id=agent.client_id,
        scopes=frozenset({"read:memory", "write:memory"}),
        token_id="test",
        issuer="test",
    )


async def run_batch(
    runtime: Runtime,
    job: Job,
    principal: Principal,
    scope: RunScope,
    cursor: str | None = None,
    size: int = 100,
) -> BatchDone:
    """One batch in its own call: committed with its audit row, or rolled back if it raised."""
    call = Call(runtime, job.name, "JOB", f"/jobs/{job.name}", caller=principal)
    # The audit row names an authenticated caller only with a token: the job's own, as the
    # runner will hold one (until then, made here).
    call.identify(principal, job_token(runtime, principal))
    try:
        try:
            done = await job.run_batch(Batch(call, principal, runtime, scope, cursor, size))
        except Problem as problem:
            await call.finish(problem.status, problem.slug)
            raise
        except BaseException:
            await call.finish(500, "internal-error")
            raise
        assert await call.finish(200) is None
        return done
    finally:
        await call.close()


async def run_all(
    runtime: Runtime,
    job: Job,
    principal: Principal,
    scope: RunScope,
    *,
    size: int = 100,
    cursor: str | None = None,
    max_batches: int = 1000,
) -> tuple[dict[str, int], int]:
    """Batches from `cursor` until the job says it is done: (summed counts, batches run)."""
    counts: Counter[str] = Counter()
    for n in range(1, max_batches + 1):
        done = await run_batch(runtime, job, principal, scope, cursor, size)
        counts.update(done.counts)
        if done.cursor is None:
            return dict(counts), n
        cursor = done.cursor
    raise AssertionError(f"{job.name} did not finish in {max_batches} batches")


class RenamedModel:
    """Another embedding model for the tests: the default model's vectors with their
    coordinates reversed (a permutation, so cosines among its own vectors are the default
    model's, while a cosine between one of its vectors and the default model's means
    nothing), under another `provider/model` name."""

    def __init__(
        self, inner: Embedder, *, name: str = "test/reversed", dimensions: int | None = None
    ) -> None:
        self._inner = inner
        self._name = name
        self._dimensions = inner.dimensions if dimensions is None else dimensions
        self.calls = 0
        self.fail_on_call: int | None = None
        """Raise on this call (1-based): a provider failing mid-run."""
        self.while_asked: Callable[[], Awaitable[None]] | None = None
        """Run while the provider is "answering" (to look at the database meanwhile)."""

    @property
    def model_id(self) -> str:
        return self._name

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def remote(self) -> bool:
        return True

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        if self.fail_on_call == self.calls:
            raise RuntimeError("the provider went away")
        if self.while_asked is not None:
            await self.while_asked()
        return [list(reversed(vector)) for vector in await self._inner.embed(texts)]


def rows(result: Any) -> list[Any]:
    return list(result.all())
