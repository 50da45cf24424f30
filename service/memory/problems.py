"""Problems of the memory API. (The retry and precondition problems every idempotent or
conditional operation answers live in service/problems.py.)"""

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


class NotAReviewer(Problem, slug="not-a-reviewer", status=403, title="Not a reviewer"):
    """You may see the space (or the proposal, as its writer) but are none of its reviewers:
    reviewing needs a `review` and a `write` grant on the space, a token with `review:memory`,
    and a caller that is no agent (a delegated token never reviews). Nothing changed."""


class NotAProposal(Problem, slug="not-a-proposal", status=409, title="Not a proposal"):
    """The memory is not waiting for review (it is an ordinary memory, or was approved
    already). Nothing changed."""


class ProposalRejected(Problem, slug="proposal-rejected", status=409, title="Proposal rejected"):
    """A reviewer of the space rejected this text before (compared after Unicode NFKC, case
    folding and collapsing white space), so it cannot be proposed there again; only a reviewer
    may write it. Nothing was written: write something else, or ask a reviewer."""


class ContentRevoked(Problem, slug="content-revoked", status=409, title="Content revoked"):
    """Asked with `on_revoked: "reject"`: the value, normalized (docs/revocation.md), equals a
    memory revoked in the target space, or a memory in `derived_from` is hidden by a
    revocation. Nothing was written. Without the flag the write is stored hidden instead."""
