"""Learn, recall, forget. No HTTP types here, and no commits: the caller owns the transaction."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, cast, get_args

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import Memory
from service.embeddings import Embedder, model_tag
from service.embeddings.base import EmbeddingInvalid
from service.erasure.problems import ContentErased
from service.memory import proposals, repository
from service.memory.batch import batch_rejected
from service.memory.etags import IfMatch, etag_of
from service.memory.normalize import content_hash
from service.memory.problems import (
    BatchRejected,
    ContentRevoked,
    EvidenceRequired,
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
from service.memory.recalls import RecallLog
from service.memory.repository import (
    AnnTuning,
    Hit,
    KeyRef,
    LiveKey,
    MemoryFilters,
    MemoryRow,
    Version,
    cast_row,
)
from service.memory.reserved import RESERVED_KEYS, SOURCE_PREFIX, SUMMARY_KIND, reserved
from service.memory.schemas import (
    AudienceNarrowing,
    CountGroup,
    GroupBy,
    HiddenNote,
    Kind,
    MemoryBatch,
    MemoryBatchWritten,
    MemoryCounts,
    MemoryCreate,
    MemoryHistory,
    MemoryOut,
    MemoryPage,
    MemoryWritten,
    Provenance,
    RevertNote,
    SearchFilters,
    SearchHit,
    SearchRequest,
    SearchResult,
    Status,
)
from service.observability.telemetry import SEARCH_DURATION, span, timed
from service.policy.space_settings import SpaceSettings
from service.policy.visible import (
    Action,
    Moment,
    Visible,
    WriteTargets,
    granted_space_ids,
    visible,
    write_targets,
)
from service.problems import BadCursor, InvalidRequest, Problem
from service.quotas.limiter import Quotas
from service.revocation import repository as revocations
from service.settings import MemorySettings
from service.shredding import vault_of

MAX_NEWER_HOPS = 10_000
"""How far a history walks forward from the version it is asked about to find the newest
one (a bound on a walk, not a page: a chain is paged from its newest version back)."""
MAX_METADATA_BYTES = 16_384
MAX_METADATA_DEPTH = 16
H = TypeVar("H")
"""A ranked hit: (row, score) for a vector search, `FusedHit` for a fused one."""
SearchPath = Literal["exact", "approximate"]
MAX_OFFERED_KEYS = 20
"""The most keys a 409 `key-choice-required` lists (a subject with more says `more_keys`)."""
OFFERED_WORDS, OFFERED_CHARS = 12, 120
"""How much of each offered key's value the 409 shows: enough to recognize the fact."""
EVIDENCE_KINDS = frozenset({"summary", "decision"})
"""The kinds the evidence gate asks sources of."""


@dataclass(frozen=True)
class Source:
    """A memory a write derives from, as the caller can read it."""

    id: uuid.UUID
    space_id: uuid.UUID
    read_requires: list[uuid.UUID]


def inherited_scope(
    space_id: uuid.UUID, sources: list[Source], audience: Sequence[uuid.UUID] = ()
) -> list[uuid.UUID]:
    """The spaces a reader of a memory in `space_id` derived from `sources` must also be able
    to read (promise 6): every source's space and everything its own sources required, and
    `audience` besides. The memory's own space narrows nothing (its readers read it
    already), so it is never listed: a memory citing a note of its own space stays in its
    key's chain, under its gate."""
    required = {source.space_id for source in sources} | set(audience)
    required.update(space for source in sources for space in source.read_requires)
    required.discard(space_id)
    return sorted(required)


def first_words(text: str) -> str:
    """The first `OFFERED_WORDS` words of `text`, at most `OFFERED_CHARS` characters, with an
    ellipsis when cut."""
    words = text.split()
    start = " ".join(words[:OFFERED_WORDS])
    if len(start) > OFFERED_CHARS:
        start = start[:OFFERED_CHARS].rsplit(" ", 1)[0] or start[:OFFERED_CHARS]
    return start if start == " ".join(words) else start + " …"


def narrowing(
    space_id: uuid.UUID, read_requires: list[uuid.UUID], personal: uuid.UUID | None
) -> AudienceNarrowing | None:
    """What a write's sources did to its audience: every space besides its own that a reader
    must also read. None when nothing narrowed it."""
    required = [space for space in read_requires if space != space_id]
    if not required:
        return None
    writer_only = personal is not None and personal in required
    who = (
        "nobody but you: one source is in your personal space"
        if writer_only
        else "only principals who can also read " + ", ".join(map(str, required))
    )
    return AudienceNarrowing(
        required_spaces=required,
        writer_only=writer_only,
        detail=(
            f"Its sources narrow who may read this memory: of the readers of space {space_id}, "
            f"{who}. Derive it from sources in that space only if it should reach all of them."
        ),
    )


def _refuse_reserved(data: MemoryCreate) -> None:
    if reserved(data.kind, data.key, data.source):
        raise ReservedForJobs(
            f"Kind 'summary' under the keys {', '.join(repr(k) for k in RESERVED_KEYS)}, "
            f"and sources starting {SOURCE_PREFIX!r}, are written by memgate's "
            "consolidation job only (a revert of its summary too: its next run re-derives "
            f"it). Nothing was written. Use another key than {data.key!r} or another "
            "source.",
            reserved_keys=[f"{SUMMARY_KIND}/{k}" for k in RESERVED_KEYS],
            reserved_source_prefix=SOURCE_PREFIX,
        )


def _require_evidence(
    gates: SpaceSettings, data: MemoryCreate, space_id: uuid.UUID, unsourced: str | None
) -> None:
    """The evidence gate: a decision or summary in a space that has it on cites its sources.
    `unsourced`: what to say instead of the default (a revert says its own words)."""
    if gates.evidence_gate and data.kind in EVIDENCE_KINDS and not data.derived_from:
        raise EvidenceRequired(
            unsourced
            or f"Space {space_id} requires evidence: a {data.kind} must cite the memories "
            "it rests on in 'derived_from' (ids you can read, e.g. from a search). "
            "Nothing was written.",
            space_id=str(space_id),
        )


@dataclass(frozen=True)
class Planned:
    """A write that passed every check needing no lock (`MemoryService._plan`)."""

    data: MemoryCreate
    ref: KeyRef
    derived_from: list[uuid.UUID]
    read_requires: list[uuid.UUID]
    gated: bool
    """The write gate asks about it (not `new_key`, not a revert, and on in its space)."""
    personal: uuid.UUID | None
    """The writer's personal space (what `narrowing` tells the writer)."""
    if_match: IfMatch | None = None
    """The live version of its key the write expects (`If-Match`), checked under the lock."""
    proposed: bool = False
    """It lands as a proposal (a reviewed space, a writer who is none of its reviewers): it
    supersedes nothing and is numbered only when approved (service/memory/review.py)."""

    @property
    def space_id(self) -> uuid.UUID:
        return self.ref.space_id

    @property
    def value(self) -> str:
        return self.data.value


class GateRefused(Exception):
    """The write gate refused writes of a batch: (place in the batch, problem) of each."""

    def __init__(self, failures: list[tuple[int, Problem]]) -> None:
        super().__init__(f"{len(failures)} writes refused by the write gate")
        self.failures = failures


def family_of(ref: KeyRef) -> KeyRef:
    """The (space, subject, kind, audience) of a key: what the write gate looks across."""
    return replace(ref, key="")


def cited_sources(readable: list[Source], derived_from: list[uuid.UUID]) -> list[Source]:
    """The sources a write cites, in its order, out of those the caller can read; one it
    cannot read is 404, like a missing id (the id is the caller's own, from its request)."""
    by_id = {source.id: source for source in readable}
    cited: list[Source] = []
    for source_id in dict.fromkeys(derived_from):
        if source_id not in by_id:
            raise MemoryNotFound(not_found_detail(source_id))
        cited.append(by_id[source_id])
    return cited


def target_space(targets: WriteTargets, requested: uuid.UUID | None) -> uuid.UUID:
    """The named space if the caller may read and write there (an invisible space is 404, a
    read-only one 403); by default the caller's personal space."""
    # Writing needs read too: a writer sees what it wrote (a new version returns its row,
    # and supersession reads the live one), and row-level security demands both.
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


def _chain_order(
    planned: list[Planned], hidden: dict[int, Any]
) -> tuple[list[int], dict[int, int]]:
    """Which writes of `planned` supersede their key's stored version (the first write of
    each key, by place), and for each write the place of the next write of its key (which
    closes it). Proposals and hidden writes join no chain: they close nothing."""
    first: dict[KeyRef, int] = {}
    latest: dict[KeyRef, int] = {}
    after: dict[int, int] = {}
    for index, one in enumerate(planned):
        if one.proposed or index in hidden:
            continue
        if one.ref in first:
            after[latest[one.ref]] = index
        else:
            first[one.ref] = index
        latest[one.ref] = index
    return list(first.values()), after


class MemoryService:
    def __init__(
        self,
        session: AsyncSession,
        embedder: Embedder,
        limits: MemorySettings,
        *,
        facts: Facts,
        quotas: Quotas | None = None,
        recalls: RecallLog | None = None,
    ) -> None:
        """`facts`: where the call's audit facts (targets, counts) are noted; `quotas`: the
        tenants' embedding-call and storage limits (None: none apply); `recalls`: where the
        ids a search or get answered are noted for `memory.age_unused` (None: nowhere)."""
        self._quotas = quotas
        self._recalls = recalls
        self._session = session
        self._facts = facts
        self._embedder = embedder
        self._limits = limits
        self._budget: repository.ReadBudget | None = None
        """The read budget of the block being run (`_read_budget`), for its last statement."""

    async def write(
        self, principal: Principal, data: MemoryCreate, if_match: IfMatch | None = None
    ) -> MemoryWritten:
        """`if_match`: the write supersedes only the live version of its (space, subject,
        kind, key, audience) it names, or with `*` only an existing one (else 412)."""
        self._check_value(data)
        sources = await self._sources_of(principal, data.derived_from)
        return await self._write(
            principal, data, sources, gated=not data.new_key, if_match=if_match
        )

    async def _write(
        self,
        principal: Principal,
        data: MemoryCreate,
        sources: list[Source],
        *,
        gated: bool,
        audience: Sequence[uuid.UUID] = (),
        unsourced: str | None = None,
        if_match: IfMatch | None = None,
    ) -> MemoryWritten:
        """Write `data` citing `sources` (each readable by the caller), under the write gate
        if `gated` (not for a revert or `new_key`) and the space has it on; readable only by
        readers of `audience` too. `unsourced`: what the evidence gate says when `data`
        cites nothing (the caller's own words by default). The batch's path with one item."""
        targets = await write_targets(self._session, principal)
        planned = self._plan(principal, data, sources, targets, gated, audience, unsourced)
        planned = replace(planned, if_match=if_match)
        [vector] = await self._embed(principal, data.value)
        with self._nothing_named_if_refused():
            try:
                [written] = await self._write_planned(principal, [planned], [vector])
            except GateRefused as refused:
                # One write may be refused for two reasons (the write gate and a tombstone, or
                # a revocation): the first answers, as the batch lists them in that order.
                raise refused.failures[0][1] from None
            if self._quotas is not None:
                # Counted by the insert's trigger; over quota: rolled back.
                await self._quotas.check_storage(self._session, principal.tenant_id)
        return written

    @contextmanager
    def _nothing_named_if_refused(self) -> Iterator[None]:
        """A write that fails after its rows were noted is rolled back: its audit row then
        names no memory (the ids of rows that never existed would be a lie)."""
        try:
            yield
        except Exception:
            self._facts.targets.clear()
            raise

    def _plan(
        self,
        principal: Principal,
        data: MemoryCreate,
        sources: list[Source],
        targets: WriteTargets,
        gated: bool,
        audience: Sequence[uuid.UUID] = (),
        unsourced: str | None = None,
    ) -> Planned:
        """Everything a write decides before touching a row: the checks that need no lock
        (reserved keys, the target space, the evidence gate), its key and its audience."""
        _refuse_reserved(data)
        space_id = target_space(targets, data.space_id)
        read_requires = inherited_scope(space_id, sources, audience)
        gates = targets.settings_of(space_id)
        _require_evidence(gates, data, space_id, unsourced)
        ref = KeyRef(
            principal.tenant_id,
            space_id,
            data.subject,
            data.kind,
            data.key,
            tuple(read_requires),
        )
        return Planned(
            data,
            ref,
            [source.id for source in sources],
            read_requires,
            gated=gated and gates.write_gate,
            personal=targets.personal,
            proposed=targets.proposes(space_id),
        )

    async def _write_planned(
        self, principal: Principal, planned: list[Planned], vectors: list[list[float]]
    ) -> list[MemoryWritten]:
        """Write `planned` in order, set-based: one statement takes every key lock (and the
        subject locks of gated writes), one asks the write gate about every gated subject, one
        supersedes every key, one inserts every row. A write is answered exactly as if each
        ran alone in that order: a later write of a key supersedes an earlier one of the same
        batch, and the gate of a later write counts the keys earlier ones wrote. If the gate
        refuses any write, nothing is written: `GateRefused` names each refused one."""
        now, ids, hidden = await self._locked_and_checked(principal, planned)
        scope = visible(principal, Action.WRITE)
        first, after = _chain_order(planned, hidden)
        made = await repository.supersede_many(
            self._session,
            scope,
            [
                repository.NewVersion(
                    planned[index].ref, ids[index], planned[index].data.valid_from or now
                )
                for index in first
            ],
            at=now,
        )
        by_first = dict(zip(first, made, strict=True))
        rows: list[Memory] = []
        answers: list[MemoryWritten] = []
        chained: dict[KeyRef, Memory] = {}
        for index, one in enumerate(planned):
            earlier = chained.get(one.ref)
            if one.proposed or index in hidden:
                previous, superseded = None, []
            elif earlier is None:
                previous, superseded = by_first[index].previous, by_first[index].superseded
            else:
                previous, superseded = Version(earlier.id, earlier.version), [earlier.id]
            row = self._new_row(
                principal, one.data, one.ref, vectors[index], now, ids[index], previous
            )
            row.derived_from, row.read_requires = one.derived_from, one.read_requires
            if one.proposed:
                row = proposals.proposal(row)
            elif index not in hidden:
                chained[one.ref] = row
            answers.append(self._answer(row, one, superseded, now, hidden.get(index)))
            if index in after:
                # Closed as the next write of its key would close it; inserted closed, since
                # the live-key index admits one live row per key.
                later = planned[after[index]]
                row.superseded_at, row.superseded_by = now, ids[after[index]]
                row.valid_until = max(row.valid_from, later.data.valid_from or now)
            rows.append(row)
            self._facts.add_targets([row.id, *superseded])
        await repository.insert_many(
            self._session, scope, rows, sealing=principal.tenant_settings.crypto_shredding
        )
        await revocations.note_hidden(
            self._session,
            principal.tenant_id,
            {ids[index]: causes for index, (causes, _) in hidden.items()},
        )
        return answers

    async def _locked_and_checked(
        self, principal: Principal, planned: list[Planned]
    ) -> tuple[datetime, list[uuid.UUID], dict[int, tuple[set[uuid.UUID], HiddenNote]]]:
        """Take every lock `planned` needs, then check what decides whether each write may
        go ahead, under them: `If-Match`, the write gate, rejected proposals and standing
        revocations. Answers the time after the locks, the new ids, and the writes a
        revocation covers (stored hidden); raises `GateRefused` naming every refused write."""
        now = await repository.lock_keys(
            self._session,
            [one.ref for one in planned],
            gated=[one.ref for one in planned if one.gated],
            # Shared with other writers, exclusive for a revoke: what `_born_hidden` reads
            # next is never a revocation half done (service/revocation/repository.py).
            shared=[revocations.lock_name(principal.tenant_id)],
        )
        await self._check_preconditions(principal, planned)  # under the locks just taken
        ids = [uuid7() for _ in planned]
        refused = await self._write_gate(principal, planned, ids)
        refused += await proposals.rejected_again(self._session, principal, planned)
        # Revocation (service/revocation): a write a standing revocation covers is stored
        # hidden, outside its key's chain (it closes nothing), or refused when asked.
        hidden, erased = await self._born_hidden(principal, planned)
        refused += [(index, content_erased()) for index in erased]
        refused += [
            (index, content_revoked(planned[index].ref, note))
            for index, (_, note) in hidden.items()
            if planned[index].data.on_revoked == "reject"
        ]
        if refused:
            raise GateRefused(sorted(refused, key=lambda failure: failure[0]))
        return now, ids, hidden

    @staticmethod
    def _answer(
        row: Memory,
        one: Planned,
        superseded: list[uuid.UUID],
        now: datetime,
        hidden: tuple[set[uuid.UUID], HiddenNote] | None,
    ) -> MemoryWritten:
        """A write's answer as written, before a later write of its key in the batch closes it
        (as each write's own answer would have been). A write a revocation covers is stored
        hidden (a proposal too: approving it could otherwise bring the revoked claim back)."""
        out = to_out(row, {})  # the entity holds the text as written (never sealed)
        if hidden is not None:
            row.revoked_at = now
            out = msgspec.structs.replace(out, status="hidden")
        return MemoryWritten(
            memory=out,
            superseded=superseded,
            audience_narrowed=narrowing(row.space_id, one.read_requires, one.personal),
            hidden=None if hidden is None else hidden[1],
        )

    async def _check_preconditions(self, principal: Principal, planned: list[Planned]) -> None:
        """412 unless every write's `If-Match` names the live version of its key (the one the
        write supersedes), read under the key locks the write holds: of two writes naming the
        same ETag, the second finds the first's version live and is refused."""
        expecting = [one for one in planned if one.if_match is not None]
        if not expecting:
            return
        live = await repository.live_versions(
            self._session, visible(principal, Action.WRITE), [one.ref for one in expecting]
        )
        for one in expecting:
            assert one.if_match is not None
            one.if_match.check(live.get(one.ref))

    async def _born_hidden(
        self, principal: Principal, planned: list[Planned]
    ) -> tuple[dict[int, tuple[set[uuid.UUID], HiddenNote]], list[int]]:
        """The writes of `planned` a standing revocation covers (by place): their value,
        normalized, equals a memory revoked in their space, or a source they cite is hidden.
        Each with the revocations that hide it (its causes) and what its answer says. Asked
        under the tenant's revocation lock (shared, taken with the key locks), in a statement
        of its own: its snapshot is taken after the lock, so a revoke is never half seen.
        Also the writes whose content an erasure keeps as a tombstone (refused)."""
        hashes = [content_hash(one.data.value) for one in planned]
        causes = await revocations.causes_of(
            self._session,
            principal.tenant_id,
            [(one.ref.space_id, hashed) for one, hashed in zip(planned, hashes, strict=True)],
            [source for one in planned for source in one.derived_from],
        )
        hidden: dict[int, tuple[set[uuid.UUID], HiddenNote]] = {}
        for index, one in enumerate(planned):
            content, derived = causes.of(one.ref.space_id, hashes[index], one.derived_from)
            if content:
                note = HiddenNote(
                    because="content-revoked",
                    detail=f"Its value, normalized, equals a memory revoked in space "
                    f"{one.ref.space_id}: it is stored hidden and no reader gets it unless "
                    "that memory is reinstated.",
                )
            elif derived:
                note = HiddenNote(
                    because="derived-from-hidden",
                    detail="A memory it cites in 'derived_from' is hidden by a revocation: "
                    "it is stored hidden and no reader gets it unless that revocation is "
                    "reinstated.",
                )
            else:
                continue
            hidden[index] = (content | derived, note)
        erased = [
            index
            for index, (one, hashed) in enumerate(zip(planned, hashes, strict=True))
            if (one.ref.space_id, hashed) in causes.erased
        ]
        return hidden, erased

    async def write_batch(self, principal: Principal, batch: MemoryBatch) -> MemoryBatchWritten:
        """Write every item of `batch` in order, each exactly as `write` would, or none: any
        item that fails makes the batch 422 `batch-rejected` listing every failing item (the
        call rolls back what the others wrote). The values are embedded in one call of the
        provider, before any write, and spend one embedding call of the tenant's quota per
        item; the storage quota is checked once, after the last insert. (An `Idempotency-Key`
        is the adapters' business: service/memory/idempotency.py.)"""
        items = batch.items
        if len(items) > self._limits.batch_max_items:
            raise InvalidRequest(
                f"The batch has {len(items)} items; the most one batch takes is "
                f"{self._limits.batch_max_items}. Nothing was written: split it.",
                errors=[
                    {
                        "field": "items",
                        "source": "body",
                        "message": f"Expected at most {self._limits.batch_max_items} items",
                    }
                ],
                max_items=self._limits.batch_max_items,
            )
        # Everything that refuses an item without its vector runs first: a refused batch
        # spends no embedding call (as a refused single write spends none).
        planned = await self._plan_items(principal, items)
        vectors = await self._embed_all(principal, [item.value for item in items])
        with self._nothing_named_if_refused():
            written = await self._write_items(principal, planned, vectors)
        answer = MemoryBatchWritten(items=written, count=len(written))
        superseded = sum(len(one.superseded) for one in written)
        self._facts.count(len(written))
        self._facts.reason = (
            f"batch:items={len(written)},created={len(written)},superseded={superseded}"
        )
        return answer

    async def _plan_items(self, principal: Principal, items: list[MemoryCreate]) -> list[Planned]:
        """Every item through the single write's checks that need no vector and no lock (its
        value, a reserved key, its target space, the evidence gate, the sources it cites),
        the write targets and every item's sources read once for the batch. Every failing
        item is listed, not only the first; any failure writes nothing."""
        targets = await write_targets(self._session, principal)
        readable = await self._readable_sources(
            principal, [source for item in items for source in item.derived_from]
        )
        planned: list[Planned] = []
        failures: list[tuple[int, Problem]] = []
        for index, item in enumerate(items):
            try:
                self._check_value(item)
                sources = cited_sources(readable, item.derived_from)
                planned.append(self._plan(principal, item, sources, targets, not item.new_key))
            except Problem as problem:
                failures.append((index, problem))
        if failures:
            raise self._rejected(failures, len(items))
        return planned

    async def _write_items(
        self, principal: Principal, planned: list[Planned], vectors: list[list[float]]
    ) -> list[MemoryWritten]:
        """The planned items, set-based (`_write_planned`); the write gate may still refuse
        some (every refused one is listed, nothing is written), and the storage quota is
        checked once, after the last insert."""
        try:
            written = await self._write_planned(principal, planned, vectors)
        except GateRefused as refused:
            raise self._rejected(refused.failures, len(planned)) from None
        if self._quotas is not None:
            await self._quotas.check_storage(self._session, principal.tenant_id)
        return written

    def _rejected(self, failures: list[tuple[int, Problem]], total: int) -> BatchRejected:
        self._facts.targets.clear()  # nothing was written: the refusal names no memory
        return batch_rejected(failures, total)

    async def _embed_all(self, principal: Principal, texts: list[str]) -> list[list[float]]:
        """`_embed` for a batch: one provider call, one embedding call of quota per text."""
        if self._quotas is not None:
            await self._quotas.admit_embeddings(principal.tenant_id, len(texts))
        if self._embedder.remote and self._session.in_transaction():
            await self._session.rollback()
        vectors = await self._embedder.embed(texts)
        if len(vectors) != len(texts):
            raise EmbeddingInvalid(
                f"The embedding provider answered {len(vectors)} vectors for {len(texts)} texts."
            )
        return vectors

    async def _write_gate(
        self, principal: Principal, planned: list[Planned], ids: list[uuid.UUID]
    ) -> list[tuple[int, Problem]]:
        """Refuse a key new to its subject while the subject has live memories of the same
        kind under other keys that the writer can read (in the space and audience the write
        goes to): the writer may not know the key the fact already lives under, and a second
        key would leave the stale value live. Which key is meant is the writer's choice, never
        decided here by similarity (promise 5). Rows the writer cannot read never count and
        are never named, so the gate tells nothing a search would not.

        One statement for every gated write of `planned` (run under their subject locks);
        each is then judged in order, counting the keys the writes before it in `planned`
        leave live (a key once written stays live: a later version replaces it; `ids` are the
        ids the writes will have). Answers the refused writes by their place in `planned`."""
        families: dict[KeyRef, list[int]] = {}
        for index, one in enumerate(planned):
            families.setdefault(family_of(one.ref), []).append(index)
        asked = [
            repository.GateQuestion(family, tuple(dict.fromkeys(planned[i].ref.key for i in at)))
            for family, at in families.items()
            if any(planned[i].gated for i in at)
        ]
        if not asked:
            return []
        found = await repository.live_keys_of_subjects(
            self._session, visible(principal, Action.READ), asked, limit=MAX_OFFERED_KEYS
        )
        refused: list[tuple[int, Problem]] = []
        for question, stored in zip(asked, found, strict=True):
            live = {one.key: one for one in stored}
            for index in families[question.ref]:
                one = planned[index]
                if one.gated:
                    problem = self._gate_answer(one.ref, live)
                    if problem is not None:
                        refused.append((index, problem))
                        continue
                live[one.ref.key] = LiveKey(one.ref.key, ids[index], one.data.value[:400])
        refused.sort(key=lambda failure: failure[0])
        return refused

    def _gate_answer(self, ref: KeyRef, live: dict[str, LiveKey]) -> KeyChoiceRequired | None:
        """The gate's answer to a write of `ref` with these keys live: None to let it pass."""
        if ref.key in live:
            return None
        others = sorted((one for key, one in live.items() if key != ref.key), key=lambda o: o.key)
        if not others:
            return None
        more = len(others) > MAX_OFFERED_KEYS
        others = others[:MAX_OFFERED_KEYS]
        offered = [
            {"key": one.key, "id": str(one.id), "value_start": first_words(one.value_start)}
            for one in others
        ]
        listing = "; ".join(f'{o["key"]} ({o["id"]}): "{o["value_start"]}"' for o in offered)
        listed_more = (
            f" and more (list them: GET /v1/memories?subject=…&kind={ref.kind})" if more else ""
        )
        self._facts.add_targets(one.id for one in others)
        return KeyChoiceRequired(
            f"Subject {ref.subject!r} already has live {ref.kind} memories under other keys in "
            f"space {ref.space_id}: {listing}{listed_more}. If your value updates one of them, "
            "resend with that 'key' (the new version supersedes it); if it is a different "
            "fact, resend with 'new_key': true. Nothing was written.",
            subject=ref.subject,
            kind=ref.kind,
            space_id=str(ref.space_id),
            keys=offered,
            more_keys=more,
        )

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

    async def get(
        self, principal: Principal, memory_id: uuid.UUID, moment: Moment | None = None
    ) -> MemoryOut:
        scope = visible(principal, Action.READ).at(moment)
        async with self._read_budget():
            row = await repository.get(self._session, scope, memory_id)
            if row is None:
                raise MemoryNotFound(not_found_detail(memory_id))
            plain = await vault_of(self._session).plaintexts([row])
            [out] = await self._sources_you_can_read(principal, [to_out(row, plain)])
        self._recalled(principal, [row.id])
        return out

    async def list_page(
        self,
        principal: Principal,
        filters: MemoryFilters,
        cursor: str | None,
        limit: int | None,
        moment: Moment | None = None,
    ) -> MemoryPage:
        page_size = self._page_size(limit)
        after = decode_cursor(cursor) if cursor else None
        await self._check_space_filter(principal, filters.space_id)
        scope = visible(principal, Action.READ).at(moment)
        async with self._read_budget():
            rows = await repository.list_page(
                self._session, scope, filters, after=after, limit=page_size + 1
            )
            plain = await vault_of(self._session).plaintexts(rows[:page_size])
            items = await self._sources_you_can_read(
                principal, [to_out(row, plain) for row in rows[:page_size]]
            )
        self._facts.count(len(items))
        next_cursor = encode_cursor(rows[page_size - 1].id) if len(rows) > page_size else None
        return MemoryPage(items=items, next_cursor=next_cursor)

    async def count(
        self,
        principal: Principal,
        filters: MemoryFilters,
        group_by: GroupBy | None,
        moment: Moment | None = None,
    ) -> MemoryCounts:
        await self._check_space_filter(principal, filters.space_id)
        max_groups = self._limits.max_page_size
        async with self._read_budget():
            total, groups = await repository.count(
                self._session,
                visible(principal, Action.READ).at(moment),
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
            subject=given.subject,
            kind=given.kind,
            key=given.key,
            space_id=given.space_id,
            embedding_model=model_tag(self._embedder),
        )
        moment = time_travel(request.as_of, request.known_at)
        await self._check_space_filter(principal, filters.space_id)
        scope = visible(principal, Action.READ).at(moment)
        floor = self._floor(request.min_score)
        [vector] = await self._embed(principal, request.query)
        attributes = {"memgate.search.k": k, "memgate.search.mode": request.mode}
        with span("memory.rank", attributes) as rank:
            async with self._read_budget(SearchTooBroad):
                if request.mode == "vector":
                    ranked, strategy = await self.rank(scope, vector, filters, k, floor)
                    plain = await vault_of(self._session).plaintexts(row for row, _ in ranked)
                    hits = [
                        SearchHit(score=score, memory=to_out(row, plain)) for row, score in ranked
                    ]
                else:
                    fusion = self._fusion(request, k, floor)
                    fused, strategy = await self.rank_fused(scope, vector, filters, k, fusion)
                    plain = await vault_of(self._session).plaintexts(hit.row for hit in fused)
                    hits = [_fused_hit(hit, plain) for hit in fused]
            rank.set_attribute("memgate.search.hits", len(hits))
            # Operators see the path; callers do not: whether the walk came back short depends
            # on rows they may not see (other tenants' too), so the answer must not tell.
            rank.set_attribute("memgate.search.strategy", strategy)
        self._facts.add_targets(hit.memory.id for hit in hits)
        self._facts.count(len(hits))
        outs = await self._sources_you_can_read(principal, [hit.memory for hit in hits])
        for hit, out in zip(hits, outs, strict=True):
            hit.memory = out
        self._recalled(principal, [hit.memory.id for hit in hits])
        return SearchResult(hits=hits, k=k, min_score=floor)

    def _recalled(self, principal: Principal, ids: list[uuid.UUID]) -> None:
        """A search or get answered these memories: noted in memory, written later in a batch
        (service/memory/recalls.py), so the read sends no statement more."""
        if self._recalls is not None and ids:
            self._recalls.note(principal.tenant_id, ids)

    async def _sources_you_can_read(
        self, principal: Principal, outs: list[MemoryOut]
    ) -> list[MemoryOut]:
        """Provenance names only the sources the caller can read now: a source deleted,
        expired or revoked since the derivation is left out and counted in
        `derived_from_withheld` (its id would point at nothing the caller may fetch). One
        statement under Visible, only when an answer cites sources at all."""
        cited = list(dict.fromkeys(i for out in outs for i in out.provenance.derived_from))
        if not cited:
            return outs
        found = await repository.readable_sources(
            self._session, visible(principal, Action.READ), cited
        )
        readable = {source_id for source_id, _, _ in found}
        for out in outs:
            sources = out.provenance.derived_from
            shown = [source for source in sources if source in readable]
            out.provenance.derived_from = shown
            out.provenance.derived_from_withheld = len(sources) - len(shown)
        return outs

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
    ) -> tuple[list[repository.FusedHit], SearchPath]:
        """`rank` for a hybrid or lexical search, on the same paths: both legs exact in one
        statement up to `exact_search_max_rows` visible rows; beyond, the vector leg walks
        the HNSW index beside the exact lexical leg, and the answer stands if at least k of
        the walk's rows clear the floor; otherwise both legs are ranked exactly after all, so
        the fused answer is never under-filled among the hits that clear the floor. A
        lexical-only search has no walk: its leg is exact whatever the size."""
        session, cap = self._session, self._limits.search_fallback_max_rows

        async def within(size_limit: int | None) -> list[repository.FusedHit] | int:
            budget = self._budget if size_limit is not None else None
            return await repository.search_fused_within(
                session,
                scope,
                vector,
                filters,
                fusion,
                k=k,
                size_limit=size_limit,
                count_limit=cap,
                budget=budget,
            )

        async def walk() -> list[repository.FusedHit] | None:
            walked, cleared = await repository.search_fused_approximate(
                session, scope, vector, filters, fusion, k=k, tuning=self._tuning()
            )
            return walked if cleared >= k else None

        return await self._ranked(scope, within, None if fusion.lexical_only else walk)

    async def rank(
        self,
        scope: Visible,
        vector: list[float],
        filters: MemoryFilters,
        k: int,
        min_score: float | None,
    ) -> tuple[list[Hit], SearchPath]:
        """The vector-only ranking (`mode=vector`), on the paths `_ranked` chooses; the walk's
        answer stands if it found k rows and every one clears the score floor."""
        session, cap = self._session, self._limits.search_fallback_max_rows

        async def within(size_limit: int | None) -> list[Hit] | int:
            if size_limit is None:
                return await repository.search_exact(
                    session, scope, vector, filters, k=k, min_score=min_score
                )
            return await repository.search_exact_within(
                session,
                scope,
                vector,
                filters,
                k=k,
                min_score=min_score,
                size_limit=size_limit,
                count_limit=cap,
                budget=self._budget,
            )

        async def walk() -> list[Hit] | None:
            nearest = await repository.search_approximate(
                session, scope, vector, filters, k=k, tuning=self._tuning()
            )
            floor = -1.0 if min_score is None else min_score
            return nearest if len(nearest) == k and all(s >= floor for _, s in nearest) else None

        return await self._ranked(scope, within, walk)

    async def _ranked(
        self,
        scope: Visible,
        within: Callable[[int | None], Awaitable[list[H] | int]],
        walk: Callable[[], Awaitable[list[H] | None]] | None,
    ) -> tuple[list[H], SearchPath]:
        """The path per query, by the size of the caller's visible set: up to
        `exact_search_max_rows` rows every one is ranked (`within`: complete and exact by
        construction); beyond, the HNSW `walk` answers if its answer stands. Otherwise the exact
        path answers after all: the walk's budget went on rows the caller may not see, or a
        floor cut into its k, and only an exact ranking knows whether k rows above the floor
        exist (promise 3: never under-filled). A search back in time ranks exactly at once:
        the covering scan and both indexes hold live rows only (bounded by the read budget)."""
        limit, cap = self._limits.exact_search_max_rows, self._limits.search_fallback_max_rows
        if scope.moment is None:
            exact = await within(limit)
            if isinstance(exact, list):
                return exact, "exact"
            if exact > cap:
                # Refused before the walk, by the caller's own visible count only: whether a
                # walk can answer depends on rows the caller may not see, so refusing only when
                # it could not would tell. Above the cap the exact fallback (linear in the
                # visible set, and forced by any `min_score` near 1) is never run.
                raise _too_broad(cap)
            walked = None if walk is None else await walk()
            if walked is not None:
                return walked, "approximate"
        everything = await within(None)
        assert isinstance(everything, list)  # no size limit: always ranked
        return everything, "exact"

    def _tuning(self) -> AnnTuning:
        return AnnTuning(self._limits.ann_ef_search, self._limits.ann_max_scan_tuples)

    async def delete(
        self, principal: Principal, memory_id: uuid.UUID, if_match: IfMatch | None = None
    ) -> None:
        """Retract one version: it stays in its chain as a content-free stub with its number
        (history shows it; no other read does), so no number is ever issued again. Deleting
        the live version leaves the key without a live value. `if_match`: only while the live
        version of its key is the one named (412 otherwise)."""
        scope = visible(principal, Action.DELETE)
        ref = await repository.key_of(self._session, scope, memory_id)
        if ref is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        # The same lock as writers: a retraction never interleaves with a supersession.
        now = await repository.lock_key(self._session, ref)
        if if_match is not None:
            live = await repository.live_versions(self._session, scope, [ref])
            if_match.check(live.get(ref))
        if not await repository.retract(self._session, scope, memory_id, now):
            raise MemoryNotFound(not_found_detail(memory_id))
        # The job's summaries built from this version hold its text: those this deleter may
        # retract go with it, in this transaction; the job's next run takes the rest.
        derived = await repository.retract_derived_summaries(self._session, scope, memory_id, now)
        self._facts.add_targets(derived)

    async def history(
        self,
        principal: Principal,
        memory_id: uuid.UUID,
        cursor: str | None,
        limit: int | None,
        moment: Moment | None = None,
    ) -> MemoryHistory:
        """The version chain of `memory_id`, newest first, from the newest version the caller
        can see (at `moment`), `limit` versions a page; a cursor continues further back."""
        size = self._page_size(limit)
        after = decode_cursor(cursor) if cursor else None
        scope = visible(principal, Action.READ).at(moment)
        async with self._read_budget():
            assert self._budget is not None
            rows = await repository.history(
                self._session,
                scope,
                memory_id if after is None else after,
                newer_hops=MAX_NEWER_HOPS if after is None else 0,
                older_hops=size if after is None else size + 1,
                skip_start=after is not None,
                restore=self._budget.restoring(),
            )
            self._budget.restored = bool(rows)
        if not rows and after is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        # Outside the budget, like a search's: the page was read under it.
        plain = await vault_of(self._session).plaintexts(rows[:size])
        items = await self._sources_you_can_read(
            principal, [to_out(cast_row(row), plain) for row in rows[:size]]
        )
        self._facts.count(len(items))
        next_cursor = encode_cursor(items[-1].id) if len(rows) > size else None
        return MemoryHistory(items=items, next_cursor=next_cursor)

    async def revert(
        self, principal: Principal, memory_id: uuid.UUID, if_match: IfMatch | None = None
    ) -> MemoryWritten:
        """Write `memory_id`'s value again as a new version of its key (superseding the live
        one), through the ordinary write path: the same checks, quotas and audit. `if_match`
        names the live version it may supersede, as a write's does."""
        async with self._read_budget():
            row = await repository.get(
                self._session, visible(principal, Action.READ), memory_id, retracted=True
            )
        if row is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        if row.retracted_at is not None:
            raise VersionRetracted(
                f"Version {row.version} ({memory_id}) was deleted and holds no value to bring "
                f"back. Nothing was changed. Pick a version whose status is not 'retracted' "
                f"from GET /v1/memories/{memory_id}/history and revert that one.",
                version=row.version,
            )
        # Only the sources the caller can still read come along: an id it cannot read is
        # never named, nor refused by id.
        sources = await self._readable_sources(principal, list(row.derived_from))
        plain = await vault_of(self._session).plaintexts([row])
        again = MemoryCreate(
            subject=row.subject,
            kind=cast_kind(row.kind),
            key=row.key,
            value=plain.get(row.id, row.value),
            metadata=row.metadata_ or None,
            source=row.source,
            space_id=row.space_id,
            derived_from=[source.id for source in sources],
        )
        self._check_value(again)  # limits may have changed since the version was written
        self._facts.add_targets([memory_id])
        dropped = len(set(row.derived_from)) - len(sources)
        cited = (
            "you can read none of the sources it was derived from any more"
            if row.derived_from
            else "it cites no sources"
        )
        unsourced = (
            f"Space {row.space_id} requires evidence for a {row.kind}, and of version "
            f"{row.version} ({memory_id}) {cited}, so it cannot be brought back as it was. "
            f"Write the {row.kind} again (POST /v1/memories, key {row.key!r}) citing memories "
            "you can read in 'derived_from'. Nothing was written."
        )
        # A revert brings back a value of this very key: the write gate has nothing to ask.
        # Its audience stays the version's: the value was derived from the sources dropped
        # too, so leaving them out must not widen who reads it (promise 6).
        written = await self._write(
            principal,
            again,
            sources,
            gated=False,
            audience=row.read_requires,
            unsourced=unsourced,
            if_match=if_match,
        )
        if dropped:
            written.reverted = RevertNote(
                sources_dropped=dropped,
                detail=(
                    f"{dropped} of the sources of version {row.version} can no longer be read "
                    "by you, so the new version does not cite them; it keeps the reverted "
                    "version's audience (provenance.read_requires)."
                ),
            )
        return written

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

    async def _readable_sources(
        self, principal: Principal, derived_from: list[uuid.UUID]
    ) -> list[Source]:
        """The sources among `derived_from` the caller can read (any version), in order."""
        if not derived_from:
            return []
        wanted = list(dict.fromkeys(derived_from))
        # Hidden sources too: a write citing one is stored hidden (service/revocation).
        found = await repository.readable_sources(
            self._session, visible(principal, Action.READ), wanted, revoked=True
        )
        by_id = {source_id: (space, inherited) for source_id, space, inherited in found}
        return [Source(i, *by_id[i]) for i in wanted if i in by_id]

    async def _sources_of(
        self, principal: Principal, derived_from: list[uuid.UUID]
    ) -> list[Source]:
        """A write's sources: each must be readable by the caller (`cited_sources`)."""
        return cited_sources(await self._readable_sources(principal, derived_from), derived_from)

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
            embedding_model=model_tag(self._embedder),
            valid_from=data.valid_from or now,
            recorded_at=now,
            expires_at=now + timedelta(seconds=ttl) if ttl else None,
            supersedes=previous.id if previous else None,
            derived_from=[],
            read_requires=[],
            source=data.source,
            metadata_=data.metadata or {},
            version=previous.version + 1 if previous else 1,
            confidence=data.confidence,
        )


def _too_broad(cap: int) -> SearchTooBroad:
    return SearchTooBroad(
        f"This search covers more than {cap} memories visible to you, more than one "
        "search may rank. Narrow it: filters.space_id, filters.kind, filters.subject "
        "or filters.key. Nothing was changed.",
        max_visible_rows=cap,
    )


def _fused_hit(hit: repository.FusedHit, plain: Mapping[uuid.UUID, str]) -> SearchHit:
    return SearchHit(
        score=hit.score,
        memory=to_out(hit.row, plain),
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


def time_travel(as_of: datetime | None, known_at: datetime | None) -> Moment | None:
    """The moment a read asks about (None: now). Each instant needs a time zone and must stay
    within years 1-9999 in UTC; future instants are allowed (docs/recall.md)."""
    for field, at in (("as_of", as_of), ("known_at", known_at)):
        if at is None:
            continue
        if at.tzinfo is None or at.utcoffset() is None:
            raise _invalid(
                field,
                f"'{field}' needs a time zone, e.g. 2026-11-30T12:00:00Z. Nothing was read.",
                "timezone required",
            )
        try:
            at.astimezone(UTC)
        except OverflowError:
            raise _invalid(
                field,
                f"'{field}' falls outside years 1-9999 once converted to UTC.",
                "out of range",
            ) from None
    moment = Moment(as_of=as_of, known_at=known_at)
    return None if moment.is_now else moment


def cast_kind(kind: str) -> Kind:
    if kind not in get_args(Kind):
        raise ValueError(f"unknown kind {kind!r}")  # the table's CHECK constraint forbids it
    return cast(Kind, kind)


def content_revoked(ref: KeyRef, note: HiddenNote) -> ContentRevoked:
    """The answer to a write asked with `on_revoked: "reject"` that a revocation covers."""
    what = (
        f"Its value, normalized, equals a memory revoked in space {ref.space_id}"
        if note.because == "content-revoked"
        else "A memory it cites in 'derived_from' is hidden by a revocation"
    )
    return ContentRevoked(
        f"{what}. Nothing was written (you asked with on_revoked 'reject'; without it the "
        "memory is stored hidden).",
        because=note.because,
        space_id=str(ref.space_id),
    )


def content_erased() -> ContentErased:
    """The answer to a write of content an erasure keeps as a tombstone."""
    return ContentErased(
        "Its value, normalized, equals a memory that was erased from this space: the content "
        "is not learned again here. Nothing was written."
    )


def not_found_detail(memory_id: uuid.UUID) -> str:
    # The same words for missing, expired, invisible and other-tenant ids: nothing to tell apart.
    return f"No memory {memory_id} is visible to you."


def status_of(row: MemoryRow) -> Status:
    if row.review_state == "proposed":
        return "proposed"
    if row.retracted_at is not None:
        return "retracted"
    if row.superseded_at is not None:
        return "superseded"
    if row.expires_at is not None and row.expires_at <= datetime.now(UTC):
        return "expired"
    return "live"


def to_out(row: MemoryRow, plain: Mapping[uuid.UUID, str]) -> MemoryOut:
    """The answer for `row`; `plain`: the opened text of the sealed rows among those answered
    (`Vault.plaintexts`), by id. An unsealed row's text is its `value`."""
    return MemoryOut(
        id=row.id,
        space_id=row.space_id,
        subject=row.subject,
        kind=row.kind,
        key=row.key,
        value=plain.get(row.id, row.value),
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
            superseded_at=row.superseded_at,
            # A stub is content-free: it cites nothing (whatever it was derived from).
            derived_from=[] if row.retracted_at is not None else list(row.derived_from),
            derived_from_withheld=0,
            read_requires=list(row.read_requires),
            embedding_model=row.embedding_model,
        ),
        retracted_at=row.retracted_at,
        etag=etag_of(row.id, row.version),
        confidence=row.confidence,
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
