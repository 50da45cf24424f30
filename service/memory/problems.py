"""Problems of the memory API."""

from __future__ import annotations

from service.problems import Problem


class MemoryNotFound(Problem, slug="memory-not-found", status=404, title="Memory not found"):
    """No memory with this id is visible to the caller. Missing, expired, another tenant's and
    invisible ids answer the same bytes."""


class SpaceNotFound(Problem, slug="space-not-found", status=404, title="Space not found"):
    """The target space does not exist or the caller cannot write there."""


class SpaceReadOnly(Problem, slug="space-read-only", status=403, title="Space is read-only"):
    """The caller may read the space but holds no write grant there."""


class ValueTooLong(Problem, slug="value-too-long", status=422, title="Value too long"):
    """The memory value exceeds the configured maximum length."""


class KOutOfRange(Problem, slug="k-out-of-range", status=422, title="k out of range"):
    """A search asked for more results than allowed (or fewer than one)."""


class NoWritableSpace(Problem, slug="no-writable-space", status=403, title="No writable space"):
    """The caller has no space it may write to."""


class VersionRetracted(Problem, slug="version-retracted", status=409, title="Version retracted"):
    """The version named was deleted (retracted): its stub keeps its number in the chain but
    holds no value to bring back. Nothing changed; revert another version of the history."""


class ReadTooBroad(Problem, slug="read-too-broad", status=422, title="Read too broad"):
    """A read of memories ran past its time budget (`MEMGATE_READ_STATEMENT_TIMEOUT_MS`) and was
    cancelled; nothing changed. Narrow it (space, kind, subject, key) and ask again."""


class SearchTooBroad(Problem, slug="search-too-broad", status=422, title="Search too broad"):
    """The search covers more visible memories than one search may rank, or ran past its time
    budget; nothing changed. Narrow it with filters (space_id, kind, subject, key), lower `k`,
    or drop a `min_score` near 1."""


class KeyChoiceRequired(
    Problem, slug="key-choice-required", status=409, title="Key choice required"
):
    """The write gate: the key is new to its subject, and the subject already has live
    memories of the same kind under other keys in that space (ones you can read). `keys` lists
    them (`key`, `id`, the first words of `value`): resend under one of those keys to supersede
    it, or with `new_key: true` if this is a different fact. Nothing was written."""


class EvidenceRequired(Problem, slug="evidence-required", status=422, title="Evidence required"):
    """The evidence gate of the target space: a `summary` or `decision` must cite the memories
    it rests on in `derived_from` (ids you can read). Nothing was written."""


class ReservedForJobs(Problem, slug="reserved-for-jobs", status=422, title="Reserved for jobs"):
    """Kind `summary` under the keys `consolidation` and `consolidation.across`, and any source
    starting `memgate:`, are written by memgate's consolidation job only (a revert of such a
    summary too: the next run re-derives it). Nothing was written; use another key or source."""


class BatchRejected(Problem, slug="batch-rejected", status=422, title="Batch rejected"):
    """At least one item of a batch write failed, so none was written (all or nothing).
    `errors` lists every failing item: its `index`, the `status`, `type`, `title` and `detail`
    the single write would have answered for it. Fix those items and send the batch again."""


class IdempotencyKeyReused(
    Problem, slug="idempotency-key-reused", status=422, title="Idempotency key reused"
):
    """The `Idempotency-Key` answered another request body within its 24 hours. Nothing was
    written: send this body under a new key (or the first body again to get its answer)."""


class IdempotencyKeyInFlight(
    Problem, slug="idempotency-key-in-flight", status=409, title="Idempotency key in flight"
):
    """A request with this `Idempotency-Key` is still being carried out. Nothing was written:
    retry after `Retry-After` seconds to get its answer."""

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class IdempotencyAnswerGone(
    Problem, slug="idempotency-answer-gone", status=410, title="Idempotency answer gone"
):
    """The request with this `Idempotency-Key` was carried out, but a memory its answer named
    has since been deleted, retracted, revoked or erased, so the answer (which held its value)
    is no longer kept. Nothing was written; read the memories before writing under a new key."""


class ContentRevoked(Problem, slug="content-revoked", status=409, title="Content revoked"):
    """Asked with `on_revoked: "reject"`: the value, normalized (docs/revocation.md), equals a
    memory revoked in the target space, or a memory in `derived_from` is hidden by a
    revocation. Nothing was written. Without the flag the write is stored hidden instead."""
