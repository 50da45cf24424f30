"""One batch of `memory.consolidate`: per (space, subject, audience) a summary written into that
space, derived from exactly the versions it was built from and readable only by those who can
read every one of them (promise 6); a cross-space summary only where a space's policy asks
for one. No commits here: the job's call owns the transaction (service/jobs/declare.py).

A batch reads everything it needs first (the items, their inputs, their previous summaries),
then asks the summarizer and the embedder with no transaction open when either calls out
(nothing is written yet, so nothing is lost), then writes, each item under its key's lock
and only if its inputs are still the ones summarized.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from service.consolidation import repository
from service.consolidation.repository import Group, InputRow, Previous
from service.consolidation.summarizers import Input, Summarizer, create_summarizer
from service.db.base import uuid7
from service.db.models import Memory
from service.jobs.declare import Batch, BatchDone
from service.memory import repository as memories
from service.memory.normalize import content_hash
from service.memory.repository import KeyRef
from service.memory.reserved import ACROSS_KEY, OUTPUT_SOURCE, SCOPE_KEY, SUMMARY_KIND
from service.memory.service import Source, inherited_scope
from service.observability.telemetry import span
from service.policy.space_settings import DEFAULT as DEFAULT_SETTINGS
from service.policy.space_settings import SpaceSettings, normalized_source
from service.policy.visible import (
    Action,
    WriteTargets,
    granted_space_ids,
    visible,
    write_targets,
)
from service.revocation import repository as revocations
from service.tenants.settings import tenant_limits

COUNTS = ("subjects_seen", "summaries_written", "unchanged", "retracted", "inputs_excluded")
"""What every batch counts (plus `retract_refused` and `changed_meanwhile` when they occur)."""
Phase = Literal["scope", "across"]


@dataclass(frozen=True)
class Item:
    """One summary to keep true: where it lives, which spaces feed it, and (per scope) the
    audience its inputs share."""

    phase: Phase
    space_id: uuid.UUID
    subject: str
    spaces: tuple[uuid.UUID, ...]
    read_requires: tuple[uuid.UUID, ...] | None
    """The group's audience (per scope); None for a cross-space summary, whose audience is
    every input's space and audience."""

    @property
    def key(self) -> str:
        return SCOPE_KEY if self.phase == "scope" else ACROSS_KEY

    def cursor(self) -> str:
        return json.dumps(
            {
                "phase": self.phase,
                "space": str(self.space_id),
                "subject": self.subject,
                "read_requires": [str(s) for s in self.read_requires or ()],
            }
        )


@dataclass
class Plan:
    """What a batch found for one item, and what it will do."""

    item: Item
    inputs: list[InputRow]
    previous: list[Previous]
    audience: list[uuid.UUID]
    fingerprint: str
    value: str = ""
    vector: list[float] = field(default_factory=list)

    @property
    def current(self) -> Previous | None:
        """The previous summary with this very audience (the chain a new one continues)."""
        wanted = tuple(self.audience)
        return next((p for p in self.previous if p.read_requires == wanted), None)

    @property
    def stale(self) -> list[Previous]:
        """Previous summaries with another audience (a cross-space summary whose inputs'
        audiences changed): the new one does not supersede them, so they are retracted."""
        wanted = tuple(self.audience)
        return [p for p in self.previous if p.read_requires != wanted]

    @property
    def retractions(self) -> list[Previous]:
        """What this item's run retracts: every previous summary when no input is left, else
        those with another audience."""
        return self.previous if self.retract_only else self.stale

    @property
    def unchanged(self) -> bool:
        current = self.current
        return bool(self.inputs) and current is not None and current.fingerprint == self.fingerprint

    @property
    def retract_only(self) -> bool:
        return not self.inputs


def fingerprint(summarizer_id: str, inputs: Sequence[InputRow]) -> str:
    """What a summary was built from: the summarizer and each input's id, version and content
    hash. Equal fingerprints: nothing to re-derive."""
    digest = hashlib.sha256(summarizer_id.encode())
    for row in sorted(inputs, key=lambda r: r.id):
        digest.update(f"|{row.id}:{row.version}:".encode() + row.content_hash)
    return digest.hexdigest()


def excluded(row: InputRow, policy: SpaceSettings) -> bool:
    """The row's space leaves memories of this source out of consolidation. Both sides are
    compared normalized (prefixes stored before normalization included), so neither case,
    outer whitespace nor full-width letters slip a source past the policy."""
    source = normalized_source(row.source or "")
    return any(
        source.startswith(normalized_source(prefix))
        for prefix in policy.consolidation.excluded_sources
    )


class Consolidation:
    def __init__(self, batch: Batch, summarizer: Summarizer | None = None) -> None:
        self._batch = batch
        self._session = batch.call.db
        self._principal = batch.principal
        self._limits = tenant_limits(batch.runtime, batch.call)
        self._summarizer = summarizer or create_summarizer(
            batch.runtime.settings.summarizer, self._limits.max_value_chars
        )
        self._max_inputs = batch.runtime.settings.summarizer.max_inputs
        self._counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self._settings: dict[uuid.UUID, SpaceSettings] = {}
        self._runner_began = False

    async def run(self) -> BatchDone:
        # A transaction the runner began before the batch holds its state (the run's lock and
        # row): this batch must not end it (`_summarize`).
        self._runner_began = self._session.in_transaction()
        targets = await write_targets(self._session, self._principal)
        self._settings = await repository.space_settings(
            self._session, self._principal.tenant_id, sorted(targets.readable)
        )
        homes = await self._homes(targets)
        start = self._batch.cursor
        purging = _purge_position(start)
        if start is None or purging is not None:
            # Every readable space: a summary in a space the job lost delete on is found too,
            # and counted `retract_refused` (kept, and said so).
            readable = sorted(
                s for s in targets.readable if self._batch.scope.space_id in (None, s)
            )
            last = await self._purge(readable, None if purging is None else purging.last)
            if last is not None:
                return BatchDone(dict(self._counts), _Purging(last).cursor())
            start = None
        items, cursor = await self._items(targets, homes, start)
        plans = [await self._plan(item) for item in items]
        self._counts["subjects_seen"] = len(items)
        to_write = [p for p in plans if not p.retract_only and not p.unchanged]
        self._counts["unchanged"] = sum(1 for p in plans if p.unchanged)
        if self._batch.scope.dry_run:
            self._counts["summaries_written"] = len(to_write)
            self._counts["retracted"] = sum(len(p.retractions) for p in plans)
            return BatchDone(dict(self._counts), cursor)
        await self._summarize(to_write)
        for plan in plans:
            await self._apply(plan)
        if to_write:
            await self._batch.runtime.quotas.check_storage(self._session, self._principal.tenant_id)
        self._batch.call.facts.count(self._counts["summaries_written"])
        return BatchDone(dict(self._counts), cursor)

    # reading ---------------------------------------------------------------------------

    async def _homes(self, targets: WriteTargets) -> list[uuid.UUID]:
        """The spaces that hold summaries: those the job may write *and* delete in, so that
        every summary it writes it can also take down when an input is deleted (write never
        implies delete, promise 4); a run for one space covers that space only."""
        scope = self._batch.scope
        deletable = set(await granted_space_ids(self._session, self._principal, Action.DELETE))
        return sorted(s for s in targets.writable if s in deletable and scope.space_id in (None, s))

    async def _purge(
        self, spaces: Sequence[uuid.UUID], after: uuid.UUID | None
    ) -> uuid.UUID | None:
        """Retract every version of a summary in `spaces` (live, superseded or expired) built
        from a version that has since been deleted: each still holds the deleted text, which
        get, history, time travel or a revert would serve again. Up to `size` a batch, in id
        order after `after`; the last id when there may be more (the run's next batch
        continues after it), else None. The live summaries this
        takes down are written again without the deleted input by this very batch."""
        size = self._batch.size
        found = await repository.tainted_summaries(
            self._session, visible(self._principal, Action.READ), spaces, after=after, limit=size
        )
        if self._batch.scope.dry_run:
            self._counts["retracted"] += len(found)
            return None
        deleter = visible(self._principal, Action.DELETE)
        for tainted in found:
            ref = KeyRef(
                self._principal.tenant_id,
                tainted.space_id,
                tainted.subject,
                SUMMARY_KIND,
                tainted.key,
                tainted.read_requires,
            )
            now = await memories.lock_key(self._session, ref)
            if await memories.retract(self._session, deleter, tainted.id, now, expired_too=True):
                self._counts["retracted"] += 1
                self._batch.call.facts.add_targets([tainted.id])
            else:  # no delete on its audience, or retracted meanwhile by another run
                self._counts["retract_refused"] = self._counts.get("retract_refused", 0) + 1
        return found[-1].id if len(found) == size else None

    async def _items(
        self, targets: WriteTargets, homes: list[uuid.UUID], start: str | None
    ) -> tuple[list[Item], str | None]:
        """The next `size` items after the cursor `start`: per-scope groups first, then
        cross-space subjects."""
        size, scope = self._batch.size, self._batch.scope
        after = _decode(start)
        subject = scope.options.get("subject")
        items: list[Item] = []
        read = visible(self._principal, Action.READ)
        if after is None or after.phase == "scope":
            groups = await repository.scope_groups(
                self._session,
                read,
                homes,
                subject=subject,
                after=None if after is None else _group_of(after),
                limit=size + 1,
            )
            items = [
                Item("scope", g.space_id, g.subject, (g.space_id,), g.read_requires) for g in groups
            ]
            if len(items) > size:
                return items[:size], items[size - 1].cursor()
            after = None
        readable = targets.readable
        for home in homes:
            if after is not None and home < after.space_id:
                continue
            policy = self._settings_of(home).consolidation
            partners = [s for s in policy.with_spaces if s in readable and s != home]
            # A home that asks for no readable partner (any more) is still looked at: its
            # cross-space summaries left from an earlier policy have one space of inputs now,
            # so their plans retract them rather than leave them live and never re-derived.
            spaces = tuple(sorted({home, *partners}))
            subjects = await repository.across_subjects(
                self._session,
                read,
                home,
                spaces,
                subject=subject,
                after=after.subject if after is not None and after.space_id == home else None,
                limit=size + 1 - len(items),
            )
            items += [Item("across", home, s, spaces, None) for s in subjects]
            if len(items) > size:
                return items[:size], items[size - 1].cursor()
        return items, None

    async def _plan(self, item: Item) -> Plan:
        read = visible(self._principal, Action.READ)
        rows = await repository.inputs_of(
            self._session,
            read,
            item.spaces,
            item.subject,
            read_requires=item.read_requires,
            limit=self._max_inputs,
        )
        inputs = [row for row in rows if not excluded(row, self._settings_of(row.space_id))]
        self._counts["inputs_excluded"] += len(rows) - len(inputs)
        if item.phase == "across" and len({row.space_id for row in inputs}) < 2:
            inputs = []  # one space only: its per-scope summary says it all
        previous = await repository.previous_summaries(
            self._session,
            read,
            item.space_id,
            item.subject,
            item.key,
            read_requires=item.read_requires,
            writer_id=self._principal.principal_id,
        )
        if item.read_requires is not None:
            # Every input of a per-scope group has the group's audience: the summary takes it
            # as it is stored, so its chain is the group's own.
            audience = list(item.read_requires)
        else:
            sources = [Source(row.id, row.space_id, list(row.read_requires)) for row in inputs]
            audience = inherited_scope(item.space_id, sources)
        return Plan(item, inputs, previous, audience, fingerprint(self._summarizer.id, inputs))

    def _settings_of(self, space_id: uuid.UUID) -> SpaceSettings:
        return self._settings.get(space_id, DEFAULT_SETTINGS)

    # the summarizer and the embedder -----------------------------------------------------

    async def _summarize(self, plans: list[Plan]) -> None:
        """Every new summary's text and vector, before anything is written. A remote model or
        embedder is not waited for inside a transaction the batch began: what it read so far
        is let go (it wrote nothing), and the next statement begins a new one naming the job
        again (service/calls.py). A transaction the runner began (its run lock and row) is
        kept: ending it would free the run for a second runner. A failure raises, and the
        batch writes nothing."""
        if not plans:
            return
        remote = self._summarizer.remote or self._batch.runtime.embedder.remote
        if remote and not self._runner_began and self._session.in_transaction():
            await self._batch.call.release()
        attributes: dict[str, str | int] = {
            "memgate.summarizer": self._summarizer.id,
            "memgate.summaries": len(plans),
        }
        with span("consolidation.summarize", attributes):
            async with self._summarizer as summarizer:
                for plan in plans:
                    inputs = [
                        Input(row.key, row.kind, row.value, row.recorded_at, row.content_hash)
                        for row in plan.inputs
                    ]
                    plan.value = await summarizer.summarize(plan.item.subject, inputs)
        await self._batch.runtime.quotas.admit_embedding(self._principal.tenant_id)
        vectors = await self._batch.runtime.embedder.embed([plan.value for plan in plans])
        for plan, vector in zip(plans, vectors, strict=True):
            plan.vector = vector

    # writing ---------------------------------------------------------------------------

    async def _apply(self, plan: Plan) -> None:
        for stale in plan.retractions:
            await self._retract(plan.item, stale)
        if plan.retract_only or plan.unchanged:
            return
        await self._write(plan)

    def _ref(self, item: Item, read_requires: Sequence[uuid.UUID]) -> KeyRef:
        return KeyRef(
            self._principal.tenant_id,
            item.space_id,
            item.subject,
            SUMMARY_KIND,
            item.key,
            tuple(read_requires),
        )

    async def _retract(self, item: Item, previous: Previous) -> None:
        """A summary none of whose inputs is left (or whose audience is no longer its inputs')
        is retracted, which takes `delete` on its space: write never implies delete (promise
        4). Without it the summary stays and is counted `retract_refused`."""
        now = await memories.lock_key(self._session, self._ref(item, previous.read_requires))
        deleter = visible(self._principal, Action.DELETE)
        if await memories.retract(self._session, deleter, previous.id, now):
            self._counts["retracted"] += 1
            self._batch.call.facts.add_targets([previous.id])
        else:
            self._counts["retract_refused"] = self._counts.get("retract_refused", 0) + 1

    async def _write(self, plan: Plan) -> None:
        item = plan.item
        ref = self._ref(item, plan.audience)
        now = await memories.lock_keys(
            self._session,
            [ref],
            # Shared with other writers, exclusive for a revoke (as a REST write takes it,
            # service/memory/service.py `_locked_and_checked`): a revoke that commits after
            # the re-check below waits for this summary and then hides it by its
            # derived_from; one that committed before is seen by the re-check.
            shared=[revocations.lock_name(self._principal.tenant_id)],
        )
        if await self._summary_stored(plan):
            # Another run wrote this very summary since this batch read (it held the lock
            # first): nothing to add.
            self._counts["unchanged"] += 1
            return
        if not await self._still_the_same(plan):
            # An input changed since it was read: this summary would not be of what is there
            # now. The next run builds the right one.
            self._counts["changed_meanwhile"] = self._counts.get("changed_meanwhile", 0) + 1
            return
        causes = await self._revoked_causes(plan)
        if causes:
            await self._write_hidden(plan, now, causes)
            return
        new_id = uuid7()
        made = await memories.supersede(
            self._session,
            visible(self._principal, Action.WRITE),
            ref,
            new_id=new_id,
            at=now,
            valid_from=now,
        )
        row = self._row(plan, new_id, now, made.previous)
        await memories.insert(
            self._session,
            visible(self._principal, Action.WRITE),
            row,
            sealing=self._principal.tenant_settings.crypto_shredding,
        )
        self._counts["summaries_written"] += 1
        self._batch.call.facts.add_targets([new_id, *made.superseded])

    async def _revoked_causes(self, plan: Plan) -> set[uuid.UUID]:
        """The standing revocations that cover the summary: its value, normalized, equals a
        memory revoked in its space, or an input is hidden. Asked under the revocation lock,
        in a statement of its own (its snapshot begins after the lock)."""
        space_id, digest = plan.item.space_id, content_hash(plan.value)
        sources = [row.id for row in plan.inputs]
        found = await revocations.causes_of(
            self._session, self._principal.tenant_id, [(space_id, digest)], sources
        )
        content, derived = found.of(space_id, digest, sources)
        return content | derived

    async def _write_hidden(self, plan: Plan, now: datetime, causes: set[uuid.UUID]) -> None:
        """A summary a revocation covers is stored hidden, as a REST write of it would be:
        outside its key's chain (it closes nothing; the live summary, if any, stays until a
        run builds one of what is left), reaching no reader unless the revocation is lifted.
        Once: while it stands, later runs find it and write nothing."""
        if await self._summary_stored(plan, hidden=True):
            self._counts["unchanged"] += 1
            return
        new_id = uuid7()
        row = self._row(plan, new_id, now, None)
        row.revoked_at = now
        await memories.insert(
            self._session,
            visible(self._principal, Action.WRITE),
            row,
            sealing=self._principal.tenant_settings.crypto_shredding,
        )
        await revocations.note_hidden(self._session, self._principal.tenant_id, {new_id: causes})
        self._counts["summaries_hidden"] = self._counts.get("summaries_hidden", 0) + 1
        self._batch.call.facts.add_targets([new_id])

    async def _summary_stored(self, plan: Plan, *, hidden: bool = False) -> bool:
        """A summary of `plan`'s inputs (same fingerprint) is stored already: a live one
        written meanwhile, or (`hidden`) one a revocation hides, which is not written again."""
        item = plan.item
        stored = await repository.previous_summaries(
            self._session,
            visible(self._principal, Action.READ),
            item.space_id,
            item.subject,
            item.key,
            read_requires=tuple(plan.audience),
            writer_id=self._principal.principal_id,
            hidden=hidden,
        )
        return any(p.fingerprint == plan.fingerprint for p in stored)

    async def _still_the_same(self, plan: Plan) -> bool:
        again = await repository.inputs_of(
            self._session,
            visible(self._principal, Action.READ),
            plan.item.spaces,
            plan.item.subject,
            read_requires=plan.item.read_requires,
            limit=self._max_inputs,
        )
        kept = [row for row in again if not excluded(row, self._settings_of(row.space_id))]
        return fingerprint(self._summarizer.id, kept) == plan.fingerprint

    def _row(
        self, plan: Plan, new_id: uuid.UUID, now: datetime, previous: memories.Version | None
    ) -> Memory:
        principal, embedder = self._principal, self._batch.runtime.embedder
        expiries = [row.expires_at for row in plan.inputs if row.expires_at is not None]
        metadata: dict[str, Any] = {
            "consolidation": {
                "fingerprint": plan.fingerprint,
                "summarizer": self._summarizer.id,
                "inputs": len(plan.inputs),
                "spaces": sorted(str(s) for s in {row.space_id for row in plan.inputs}),
            }
        }
        return Memory(
            tenant_id=principal.tenant_id,
            id=new_id,
            space_id=plan.item.space_id,
            owner_id=principal.principal_id,
            writer_id=principal.principal_id,
            client_id=principal.client_id,
            act=principal.act,
            subject=plan.item.subject,
            kind=SUMMARY_KIND,
            key=plan.item.key,
            value=plan.value,
            content_hash=content_hash(plan.value),
            embedding=plan.vector,
            lexical_config=self._limits.text_search_config,
            embedding_model=f"{embedder.model_id}@{embedder.dimensions}",
            valid_from=now,
            recorded_at=now,
            # Never outlives an input: when the first one expires, so does the summary, and
            # the next run builds one without it.
            expires_at=min(expiries) if expiries else None,
            supersedes=previous.id if previous else None,
            derived_from=[row.id for row in plan.inputs],
            read_requires=plan.audience,
            source=OUTPUT_SOURCE,
            metadata_=metadata,
            version=previous.version + 1 if previous else 1,
        )


@dataclass(frozen=True)
class _After:
    phase: Phase
    space_id: uuid.UUID
    subject: str
    read_requires: tuple[uuid.UUID, ...]


@dataclass(frozen=True)
class _Purging:
    """Where a run retracting summary versions built from deleted inputs stands."""

    last: uuid.UUID

    def cursor(self) -> str:
        return json.dumps({"phase": "purge", "after": str(self.last)})


def _purge_position(cursor: str | None) -> _Purging | None:
    if cursor is None:
        return None
    raw = json.loads(cursor)
    return _Purging(uuid.UUID(raw["after"])) if raw.get("phase") == "purge" else None


def _decode(cursor: str | None) -> _After | None:
    if cursor is None:
        return None
    raw = json.loads(cursor)
    return _After(
        raw["phase"],
        uuid.UUID(raw["space"]),
        raw["subject"],
        tuple(uuid.UUID(s) for s in raw["read_requires"]),
    )


def _group_of(after: _After) -> Group:
    return Group(after.space_id, after.subject, after.read_requires)


async def run_batch(batch: Batch) -> BatchDone:
    """The job's batch function (service/consolidation/jobs.py)."""
    return await Consolidation(batch).run()
