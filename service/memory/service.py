"""Learn, recall, forget. No HTTP types here, and no commits: the caller owns the transaction."""

from __future__ import annotations

import base64
import hashlib
import json
import unicodedata
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import Memory
from service.embeddings import Embedder
from service.memory import repository
from service.memory.problems import (
    DeleteNeedsWrite,
    KOutOfRange,
    MemoryNotFound,
    NoWritableSpace,
    ReadTooBroad,
    SearchTooBroad,
    SpaceNotFound,
    SpaceReadOnly,
    ValueTooLong,
)
from service.memory.repository import AnnTuning, Hit, KeyRef, MemoryFilters, MemoryRow, Version
from service.memory.schemas import (
    CountGroup,
    GroupBy,
    MemoryCounts,
    MemoryCreate,
    MemoryOut,
    MemoryPage,
    MemoryWritten,
    Provenance,
    SearchFilters,
    SearchHit,
    SearchRequest,
    SearchResult,
    Status,
)
from service.observability.telemetry import SEARCH_DURATION, span, timed
from service.policy.visible import (
    Action,
    Visible,
    granted_space_ids,
    visible,
    write_targets,
)
from service.problems import BadCursor, InvalidRequest
from service.quotas.limiter import Quotas
from service.settings import MemorySettings

MAX_METADATA_BYTES = 16_384
MAX_METADATA_DEPTH = 16


def content_hash(value: str) -> bytes:
    """Hash of the normalized text (NFKC, case-folded, whitespace collapsed): the same fact
    re-written with different spacing or case hashes the same (used by revocation later)."""
    normalized = " ".join(unicodedata.normalize("NFKC", value).casefold().split())
    return hashlib.sha256(normalized.encode()).digest()


class MemoryService:
    def __init__(
        self,
        session: AsyncSession,
        embedder: Embedder,
        limits: MemorySettings,
        *,
        facts: Facts,
        quotas: Quotas | None = None,
    ) -> None:
        """`facts`: where the call's audit facts (targets, counts) are noted; `quotas`: the
        tenants' embedding-call and storage limits (None: none apply)."""
        self._quotas = quotas
        self._session = session
        self._facts = facts
        self._embedder = embedder
        self._limits = limits
        self._budget: repository.ReadBudget | None = None
        """The read budget of the block being run (`_read_budget`), for its last statement."""

    async def write(self, principal: Principal, data: MemoryCreate) -> MemoryWritten:
        self._check_value(data)
        read_requires = await self._inherited_scope(principal, data.derived_from)
        ref = KeyRef(
            principal.tenant_id,
            await self._target_space(principal, data.space_id),
            data.subject,
            data.kind,
            data.key,
            tuple(read_requires),
        )
        scope = visible(principal, Action.WRITE)
        [vector] = await self._embed(principal, data.value)
        now = await repository.lock_key(self._session, ref)
        new_id, valid_from = uuid7(), data.valid_from or now
        made = await repository.supersede(
            self._session, scope, ref, new_id=new_id, at=now, valid_from=valid_from
        )
        row = self._new_row(principal, data, ref, vector, now, new_id, made.previous)
        row.derived_from, row.read_requires = list(dict.fromkeys(data.derived_from)), read_requires
        row = await repository.insert(self._session, row)
        if self._quotas is not None:  # counted by the insert's trigger; over quota: rolled back
            await self._quotas.check_storage(self._session, principal.tenant_id)
        self._facts.add_targets([row.id, *made.superseded])
        return MemoryWritten(memory=to_out(row), superseded=made.superseded)

    async def _embed(self, principal: Principal, text: str) -> list[list[float]]:
        """Embed `text`. A remote provider may take seconds: the transaction (so far only reads
        of grants and spaces) ends first, so no connection waits idle in a transaction for it;
        the next statement begins a new one, naming the caller again (service/calls.py). The
        tenant's embedding-call limit is spent first (429 `rate-limited`, nothing done)."""
        if self._quotas is not None:
            await self._quotas.admit_embedding(principal.tenant_id)
        if self._embedder.remote and self._session.in_transaction():
            await self._session.rollback()
        return await self._embedder.embed([text])

    async def get(self, principal: Principal, memory_id: uuid.UUID) -> MemoryOut:
        scope = visible(principal, Action.READ)
        async with self._read_budget():
            row = await repository.get(self._session, scope, memory_id)
        if row is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        return to_out(row)

    async def list_page(
        self, principal: Principal, filters: MemoryFilters, cursor: str | None, limit: int | None
    ) -> MemoryPage:
        page_size = self._page_size(limit)
        after = decode_cursor(cursor) if cursor else None
        await self._check_space_filter(principal, filters.space_id)
        scope = visible(principal, Action.READ)
        async with self._read_budget():
            rows = await repository.list_page(
                self._session, scope, filters, after=after, limit=page_size + 1
            )
        items = [to_out(row) for row in rows[:page_size]]
        self._facts.count(len(items))
        next_cursor = encode_cursor(rows[page_size - 1].id) if len(rows) > page_size else None
        return MemoryPage(items=items, next_cursor=next_cursor)

    async def count(
        self, principal: Principal, filters: MemoryFilters, group_by: GroupBy | None
    ) -> MemoryCounts:
        await self._check_space_filter(principal, filters.space_id)
        max_groups = self._limits.max_page_size
        async with self._read_budget():
            total, groups = await repository.count(
                self._session,
                visible(principal, Action.READ),
                filters,
                group_by=group_by,
                max_groups=max_groups + 1,
            )
        self._facts.count(total)
        return MemoryCounts(
            total=total,
            group_by=group_by,
            groups=[CountGroup(value=value, count=n) for value, n in groups[:max_groups]],
            more_groups=len(groups) > max_groups,
        )

    async def _check_space_filter(self, principal: Principal, space_id: uuid.UUID | None) -> None:
        """A filter on a space the caller cannot read is 404 (the same for a space that does
        not exist or is another tenant's), never an empty answer that looks like knowledge."""
        if space_id is None:
            return
        if space_id not in await granted_space_ids(self._session, principal, Action.READ):
            raise SpaceNotFound(f"Space {space_id} does not exist or is not readable by you.")

    async def search(self, principal: Principal, request: SearchRequest) -> SearchResult:
        with timed(SEARCH_DURATION):
            return await self._search(principal, request)

    async def _search(self, principal: Principal, request: SearchRequest) -> SearchResult:
        k = self._k(request.k)
        given = request.filters or SearchFilters()
        filters = MemoryFilters(
            subject=given.subject, kind=given.kind, key=given.key, space_id=given.space_id
        )
        await self._check_space_filter(principal, filters.space_id)
        scope = visible(principal, Action.READ)
        floor = self._floor(request.min_score)
        [vector] = await self._embed(principal, request.query)
        attributes = {"memgate.search.k": k, "memgate.search.mode": request.mode}
        with span("memory.rank", attributes) as rank:
            async with self._read_budget(SearchTooBroad):
                if request.mode == "vector":
                    ranked, strategy = await self.rank(scope, vector, filters, k, floor)
                    hits = [SearchHit(score=score, memory=to_out(row)) for row, score in ranked]
                else:
                    fusion = self._fusion(request, k, floor)
                    fused, strategy = await self.rank_fused(scope, vector, filters, k, fusion)
                    hits = [_fused_hit(hit) for hit in fused]
            rank.set_attribute("memgate.search.hits", len(hits))
            # Operators see the path; callers do not: whether the walk came back short depends
            # on rows they may not see (other tenants' too), so the answer must not tell.
            rank.set_attribute("memgate.search.strategy", strategy)
        self._facts.add_targets(hit.memory.id for hit in hits)
        self._facts.count(len(hits))
        return SearchResult(hits=hits, k=k, min_score=floor)

    def _floor(self, requested: float | None) -> float | None:
        """The cosine floor of a search: the request's `min_score`, else the tenant's
        `score_floor`, else the operator's (already merged into the limits). 0 or less: none."""
        floor = self._limits.score_floor if requested is None else requested
        return floor if floor > 0 else None

    def _fusion(self, request: SearchRequest, k: int, floor: float | None) -> repository.Fusion:
        # The lexical floor rises with a raised cosine floor (a caller asking for closer
        # matches gets closer word matches too) and goes off with it.
        lexical_floor = None if floor is None else max(self._limits.lexical_floor, floor)
        return repository.Fusion(
            text=request.query,
            config=self._limits.text_search_config,
            depth=max(k, self._limits.fusion_depth),
            vector_floor=floor,
            lexical_floor=lexical_floor,
            lexical_only=request.mode == "lexical",
        )

    async def rank_fused(
        self,
        scope: Visible,
        vector: list[float],
        filters: MemoryFilters,
        k: int,
        fusion: repository.Fusion,
    ) -> tuple[list[repository.FusedHit], Literal["exact", "approximate"]]:
        """`rank` for a hybrid or lexical search, on the same paths: both legs exact in one
        statement up to `exact_search_max_rows` visible rows; beyond, the vector leg walks
        the HNSW index beside the exact lexical leg, and the answer stands if at least k of
        the walk's rows clear the floor; otherwise both legs are ranked exactly after all, so
        the fused answer is never under-filled among the hits that clear the floor. A
        lexical-only search has no walk: its leg is exact whatever the size."""
        limit, cap = self._limits.exact_search_max_rows, self._limits.search_fallback_max_rows
        exact = await repository.search_fused_within(
            self._session,
            scope,
            vector,
            filters,
            fusion,
            k=k,
            size_limit=limit,
            count_limit=cap,
            budget=self._budget,
        )
        if isinstance(exact, list):
            return exact, "exact"
        if exact > cap:
            raise _too_broad(cap)
        if not fusion.lexical_only:
            tuning = AnnTuning(self._limits.ann_ef_search, self._limits.ann_max_scan_tuples)
            walked, cleared = await repository.search_fused_approximate(
                self._session, scope, vector, filters, fusion, k=k, tuning=tuning
            )
            if cleared >= k:
                return walked, "approximate"
        everything = await repository.search_fused_within(
            self._session, scope, vector, filters, fusion, k=k, size_limit=None, count_limit=cap
        )
        assert isinstance(everything, list)  # no size limit: always ranked
        return everything, "exact"

    async def rank(
        self,
        scope: Visible,
        vector: list[float],
        filters: MemoryFilters,
        k: int,
        min_score: float | None,
    ) -> tuple[list[Hit], Literal["exact", "approximate"]]:
        """The path per query, by the size of the caller's visible set: up to
        `exact_search_max_rows` rows every one is ranked (complete and exact by construction);
        beyond, the HNSW walk answers if it found k rows and every one clears the score floor.
        Otherwise the exact path answers after all: the walk's budget went on rows the caller
        may not see, or a floor cut into its k, and only an exact ranking knows whether k rows
        above the floor exist (promise 3: never under-filled)."""
        limit, cap = self._limits.exact_search_max_rows, self._limits.search_fallback_max_rows
        exact = await repository.search_exact_within(
            self._session,
            scope,
            vector,
            filters,
            k=k,
            min_score=min_score,
            size_limit=limit,
            count_limit=cap,
            budget=self._budget,
        )
        if isinstance(exact, list):
            return exact, "exact"
        if exact > cap:
            # Refused before the walk, by the caller's own visible count only: whether a walk
            # can answer depends on rows the caller may not see, so refusing only when it
            # could not would tell. Above the cap the exact fallback (linear in the visible
            # set, and forced by any `min_score` near 1) is never run.
            raise _too_broad(cap)
        tuning = AnnTuning(self._limits.ann_ef_search, self._limits.ann_max_scan_tuples)
        nearest = await repository.search_approximate(
            self._session, scope, vector, filters, k=k, tuning=tuning
        )
        floor = -1.0 if min_score is None else min_score
        if len(nearest) == k and all(score >= floor for _, score in nearest):
            return nearest, "approximate"
        everything = await repository.search_exact(
            self._session, scope, vector, filters, k=k, min_score=min_score
        )
        return everything, "exact"

    async def delete(self, principal: Principal, memory_id: uuid.UUID) -> None:
        """Delete one version. One with neighbours in its chain re-links them (the predecessor
        points at the successor), which is an update: it needs write on the space as well as
        delete, or the delete is refused and nothing changes. Never a dangling chain."""
        scope = visible(principal, Action.DELETE)
        ref = await repository.key_of(self._session, scope, memory_id)
        if ref is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        # The same lock as writers: a delete never interleaves with a supersession, so the
        # neighbours read here are the ones the splice updates.
        await repository.lock_key(self._session, ref)
        links = await repository.chain_links(self._session, scope, memory_id)
        if links is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        relink = visible(principal, Action.WRITE)
        if not await repository.relinkable(self._session, relink, links.neighbours):
            raise DeleteNeedsWrite(
                f"Memory {memory_id} has other versions under its key; deleting it re-links "
                f"them, which needs write on space {ref.space_id} as well as delete. Nothing "
                "was deleted. Ask an admin for write on that space, or for a principal who "
                "holds both.",
                space_id=str(ref.space_id),
            )
        if not await repository.delete(self._session, scope, relink, memory_id):
            raise MemoryNotFound(not_found_detail(memory_id))

    @asynccontextmanager
    async def _read_budget(
        self, problem: type[SearchTooBroad | ReadTooBroad] = ReadTooBroad
    ) -> AsyncIterator[None]:
        """Every read of memories runs under the read statement timeout; one that runs past it
        answers `problem`, saying what to change, and the aborted transaction keeps nothing."""
        budget = self._limits.read_statement_timeout_ms
        try:
            async with repository.read_budget(self._session, budget) as self._budget:
                yield
        except repository.ReadCancelled:
            raise problem(
                f"This read took longer than its {budget} ms budget and was stopped. Narrow "
                "it: filters.space_id (or space_id), kind, subject or key"
                + (", a smaller 'k', or no 'min_score' near 1" if problem is SearchTooBroad else "")
                + ". Nothing was changed.",
                timeout_ms=budget,
            ) from None
        finally:
            self._budget = None

    def _check_value(self, data: MemoryCreate) -> None:
        if len(data.value) > self._limits.max_value_chars:
            raise ValueTooLong(
                f"'value' has {len(data.value)} characters; the maximum is "
                f"{self._limits.max_value_chars}. Split it into several memories with "
                "distinct keys, or store a summary.",
                max_value_chars=self._limits.max_value_chars,
            )
        if data.metadata is not None:
            check_metadata(data.metadata)
        if data.valid_from is not None:
            check_valid_from(data.valid_from)

    async def _inherited_scope(
        self, principal: Principal, derived_from: list[uuid.UUID]
    ) -> list[uuid.UUID]:
        """The spaces a derived memory's reader must also be able to read: every source's
        space and everything its own sources required. An unreadable source is 404."""
        if not derived_from:
            return []
        wanted = list(dict.fromkeys(derived_from))
        found = await repository.readable_sources(
            self._session, visible(principal, Action.READ), wanted
        )
        readable = {source_id for source_id, _, _ in found}
        for source_id in wanted:
            if source_id not in readable:
                raise MemoryNotFound(not_found_detail(source_id))
        required = {space for _, space, _ in found}
        required.update(space for _, _, inherited in found for space in inherited)
        return sorted(required)

    async def _target_space(self, principal: Principal, requested: uuid.UUID | None) -> uuid.UUID:
        """The named space if the caller may read and write there (an invisible space is 404, a
        read-only one 403); by default the caller's personal space."""
        # Writing needs read too: a writer sees what it wrote (a new version returns its row,
        # and supersession reads the live one), and row-level security demands both.
        targets = await write_targets(self._session, principal)
        readable, writable = targets.readable, targets.writable
        if requested is not None:
            if requested in writable:
                return requested
            if requested in readable:
                raise SpaceReadOnly(f"You may read space {requested} but not write there.")
            raise SpaceNotFound(f"Space {requested} does not exist or is not writable by you.")
        if targets.personal is not None and targets.personal in writable:
            return targets.personal
        if len(writable) == 1:
            return writable[0]
        if not writable:
            raise NoWritableSpace("You have no space to write memories into; ask an admin.")
        raise NoWritableSpace(
            "You may write into several spaces but not into a personal one: name 'space_id'."
        )

    def _k(self, requested: int | None) -> int:
        k = self._limits.default_k if requested is None else requested
        if not 1 <= k <= self._limits.max_k:
            raise KOutOfRange(
                f"'k' must be between 1 and {self._limits.max_k}; got {k}.",
                max_k=self._limits.max_k,
            )
        return k

    def _page_size(self, limit: int | None) -> int:
        size = min(50, self._limits.max_page_size) if limit is None else limit
        if not 1 <= size <= self._limits.max_page_size:
            raise InvalidRequest(
                f"'limit' must be between 1 and {self._limits.max_page_size}; got {size}.",
                errors=[{"field": "limit", "message": "out of range"}],
            )
        return size

    def _new_row(
        self,
        principal: Principal,
        data: MemoryCreate,
        ref: KeyRef,
        vector: list[float],
        now: datetime,
        new_id: uuid.UUID,
        previous: Version | None,
    ) -> Memory:
        # A tenant's default TTL applies to writes that give none (service/tenants/settings.py).
        ttl = data.ttl_seconds or self._limits.default_ttl_seconds
        return Memory(
            tenant_id=principal.tenant_id,
            id=new_id,
            space_id=ref.space_id,
            owner_id=principal.principal_id,
            writer_id=principal.principal_id,
            client_id=principal.client_id,
            act=principal.act,
            subject=data.subject,
            kind=data.kind,
            key=data.key,
            value=data.value,
            content_hash=content_hash(data.value),
            embedding=vector,
            # The tenant's language now: the row's lexemes are made with it (docs/recall.md).
            lexical_config=self._limits.text_search_config,
            # provider/model@dimensions: what a re-embedding job needs to find stale rows.
            embedding_model=f"{self._embedder.model_id}@{self._embedder.dimensions}",
            valid_from=data.valid_from or now,
            recorded_at=now,
            expires_at=now + timedelta(seconds=ttl) if ttl else None,
            supersedes=previous.id if previous else None,
            derived_from=[],
            read_requires=[],
            source=data.source,
            metadata_=data.metadata or {},
            version=previous.version + 1 if previous else 1,
        )


def _too_broad(cap: int) -> SearchTooBroad:
    return SearchTooBroad(
        f"This search covers more than {cap} memories visible to you, more than one "
        "search may rank. Narrow it: filters.space_id, filters.kind, filters.subject "
        "or filters.key. Nothing was changed.",
        max_visible_rows=cap,
    )


def _fused_hit(hit: repository.FusedHit) -> SearchHit:
    return SearchHit(
        score=hit.score,
        memory=to_out(hit.row),
        lexical_score=hit.lexical_score,
        fused_score=hit.fused_score,
    )


def _invalid(field: str, detail: str, message: str) -> InvalidRequest:
    return InvalidRequest(detail, errors=[{"field": field, "message": message}])


def check_metadata(metadata: dict[str, Any]) -> None:
    """Size, depth, and no NUL characters (PostgreSQL text and jsonb cannot store them)."""
    if len(json.dumps(metadata)) > MAX_METADATA_BYTES:
        raise _invalid(
            "metadata",
            f"'metadata' is larger than {MAX_METADATA_BYTES} bytes of JSON.",
            "too large",
        )
    stack: list[tuple[Any, int]] = [(metadata, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            raise _invalid(
                "metadata",
                f"'metadata' is nested deeper than {MAX_METADATA_DEPTH} levels.",
                "too deep",
            )
        if isinstance(value, dict):
            stack.extend((key, depth) for key in value)
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and "\x00" in value:
            raise _invalid(
                "metadata", "'metadata' contains a NUL character (\\u0000).", "NUL character"
            )


def check_valid_from(valid_from: datetime) -> None:
    if valid_from.tzinfo is None:
        raise _invalid(
            "valid_from",
            "'valid_from' needs a timezone, e.g. 2026-11-30T12:00:00Z.",
            "timezone required",
        )
    try:
        valid_from.astimezone(UTC)
    except OverflowError:
        raise _invalid(
            "valid_from",
            "'valid_from' falls outside years 1-9999 once converted to UTC.",
            "out of range",
        ) from None


def not_found_detail(memory_id: uuid.UUID) -> str:
    # The same words for missing, expired, invisible and other-tenant ids: nothing to tell apart.
    return f"No memory {memory_id} is visible to you."


def status_of(row: MemoryRow) -> Status:
    if row.superseded_at is not None:
        return "superseded"
    if row.expires_at is not None and row.expires_at <= datetime.now(UTC):
        return "expired"
    return "live"


def to_out(row: MemoryRow) -> MemoryOut:
    return MemoryOut(
        id=row.id,
        space_id=row.space_id,
        subject=row.subject,
        kind=row.kind,
        key=row.key,
        value=row.value,
        status=status_of(row),
        valid_from=row.valid_from,
        valid_until=row.valid_until,
        expires_at=row.expires_at,
        supersedes=row.supersedes,
        superseded_by=row.superseded_by,
        metadata=row.metadata_,
        version=row.version,
        provenance=Provenance(
            writer_id=row.writer_id,
            client_id=row.client_id,
            act=row.act,
            source=row.source,
            recorded_at=row.recorded_at,
            derived_from=list(row.derived_from),
            embedding_model=row.embedding_model,
        ),
    )


def encode_cursor(last_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(json.dumps({"v": 1, "after": str(last_id)}).encode()).decode()


MAX_CURSOR_CHARS = 200


def decode_cursor(cursor: str) -> uuid.UUID:
    if len(cursor) > MAX_CURSOR_CHARS:
        cursor = ""  # no cursor this API returns is that long; refuse without parsing it
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        payload = json.loads(base64.urlsafe_b64decode(padded.encode()))
        version, after = payload["v"], payload["after"]
    except (ValueError, TypeError, KeyError, UnicodeError, RecursionError):
        version, after = None, None
    try:
        if version == 1:
            return uuid.UUID(str(after))
    except ValueError:
        pass
    raise BadCursor(
        "The 'cursor' is not one this API returned. Pass 'next_cursor' from the previous "
        "page unchanged, or omit it to start from the first page."
    )
