"""HTTP routes of the memory API: learn, recall, forget."""

from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller, Request, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.trail import trail_of
from service.auth.guards import requires
from service.auth.principal import Principal
from service.auth.scopes import Scope
from service.auth.tokens import VerifiedToken
from service.http.deps import Db, Rt
from service.http.params import parse_id
from service.memory.repository import MemoryFilters
from service.memory.schemas import (
    KEY_PATTERN,
    SUBJECT_PATTERN,
    GroupBy,
    Kind,
    MemoryCounts,
    MemoryCreate,
    MemoryOut,
    MemoryPage,
    MemoryWritten,
    SearchRequest,
    SearchResult,
)
from service.memory.service import MemoryService
from service.runtime import Runtime

AuthedRequest = Request[Principal, VerifiedToken, State]


def provide_filters(
    subject: Annotated[
        str | None, QueryParameter(pattern=SUBJECT_PATTERN, min_length=1, max_length=200)
    ] = None,
    kind: FromQuery[Kind | None] = None,
    key: Annotated[
        str | None, QueryParameter(pattern=KEY_PATTERN, min_length=1, max_length=200)
    ] = None,
    space_id: FromQuery[uuid.UUID | None] = None,
) -> MemoryFilters:
    """The query filters list and counts share."""
    return MemoryFilters(subject=subject, kind=kind, key=key, space_id=space_id)


def _service(session: AsyncSession, runtime: Runtime) -> MemoryService:
    return MemoryService(session, runtime.embedder, runtime.settings.memory)


class MemoryController(Controller):
    path = "/v1/memories"
    tags = ["memories"]
    dependencies = {"filters": Provide(provide_filters, sync_to_thread=False)}

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        guards=[requires(Scope.WRITE_MEMORY)],
        opt={"action": "memory.write"},
    )
    async def remember(
        self, request: AuthedRequest, data: JSONBody[MemoryCreate], db: Db, runtime: Rt
    ) -> MemoryWritten:
        """Write a memory into one of your spaces (default: your personal space). A memory with
        the same subject, kind and key in that space supersedes the live one."""
        written = await _service(db, runtime).write(request.user, data)
        trail_of(request).add_targets([written.memory.id, *written.superseded])
        return written

    @get("/", guards=[requires(Scope.READ_MEMORY)], opt={"action": "memory.list"})
    async def list_memories(
        self,
        request: AuthedRequest,
        db: Db,
        runtime: Rt,
        filters: NamedDependency[MemoryFilters],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[
            int | None, QueryParameter(description="Page size (1-100, default 50).")
        ] = None,
    ) -> MemoryPage:
        """List live memories visible to you, newest first, with cursor pagination."""
        page = await _service(db, runtime).list_page(request.user, filters, cursor, limit)
        trail_of(request).count(len(page.items))
        return page

    @get("/counts", guards=[requires(Scope.READ_MEMORY)], opt={"action": "memory.count"})
    async def count_memories(
        self,
        request: AuthedRequest,
        db: Db,
        runtime: Rt,
        filters: NamedDependency[MemoryFilters],
        group_by: FromQuery[GroupBy | None] = None,
    ) -> MemoryCounts:
        """Count the live memories visible to you, optionally per kind, space or subject (the
        largest groups first). Counts cover exactly what list and search can return."""
        counts = await _service(db, runtime).count(request.user, filters, group_by)
        trail_of(request).count(counts.total)
        return counts

    @post(
        "/search",
        status_code=200,
        guards=[requires(Scope.READ_MEMORY)],
        opt={"action": "memory.search"},
    )
    async def search(
        self, request: AuthedRequest, data: JSONBody[SearchRequest], db: Db, runtime: Rt
    ) -> SearchResult:
        """Rank the live memories visible to you by similarity to `query`; at most `k` hits, each
        with score and provenance. `min_score` lets the answer be "nothing relevant"."""
        result = await _service(db, runtime).search(request.user, data)
        trail = trail_of(request)
        trail.add_targets(hit.memory.id for hit in result.hits)
        trail.count(len(result.hits))
        return result

    @get("/{memory_id:str}", guards=[requires(Scope.READ_MEMORY)], opt={"action": "memory.get"})
    async def recall(
        self, request: AuthedRequest, memory_id: FromPath[str], db: Db, runtime: Rt
    ) -> MemoryOut:
        """Get one memory by id (superseded versions included, with their links)."""
        return await _service(db, runtime).get(request.user, parse_id(memory_id))

    @delete(
        "/{memory_id:str}",
        status_code=HTTP_204_NO_CONTENT,
        guards=[requires(Scope.DELETE_MEMORY)],
        opt={"action": "memory.delete"},
    )
    async def forget(
        self, request: AuthedRequest, memory_id: FromPath[str], db: Db, runtime: Rt
    ) -> None:
        """Delete one memory. Needs `delete:memory`; `write:memory` does not imply it."""
        await _service(db, runtime).delete(request.user, parse_id(memory_id))
