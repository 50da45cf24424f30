"""Per-space settings: the gates on writes into a space (docs/recall.md, "Write gate"), how
long its memories may go unused (docs/jobs.md, "memory.age_unused") and what consolidation may
do with the space (docs/jobs.md, "memory.consolidate").

Stored as `spaces.settings` (jsonb) and set whole by a policy admin through
`PUT /v1/spaces/{id}/settings`; read by the write path in the statement that finds where the
caller may write (service/policy/visible.py `write_targets`), so a write pays no extra round
trip for them.
"""

from __future__ import annotations

import unicodedata
import uuid
from typing import Annotated, Any

import msgspec

MAX_UNUSED_DAYS_LIMIT = 36_500
"""A hundred years: anything longer means never, which is the default (null)."""

EXTERNAL_SOURCE = "external:"
"""The `source` prefix that marks external context: a memory written from what a tool read
elsewhere (`external:web`, `external:mcp-resource`), not from what a principal knows."""

SourcePrefix = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"\S")]


def normalized_source(source: str) -> str:
    """A source as the source policy compares it: NFKC, case-folded, outer whitespace
    stripped, so `External:web`, ` external:web` and full-width letters are all `external:`
    (a writer chooses its source; a policy must not be bypassed by spelling)."""
    return unicodedata.normalize("NFKC", source).casefold().strip()


class ConsolidationPolicy(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What `memory.consolidate` may do with the memories of this space."""

    with_spaces: Annotated[list[uuid.UUID], msgspec.Meta(max_length=16)] = []
    """Spaces whose memories of a subject may be consolidated together with this space's into
    one cross-space summary written here (key `consolidation.across`), readable only by
    principals who can read this space and every one of those (promise 6). Empty (the
    default): every summary is of one space only."""
    excluded_sources: Annotated[list[SourcePrefix], msgspec.Meta(max_length=32)] = msgspec.field(
        default_factory=lambda: [EXTERNAL_SOURCE]
    )
    """Memories whose `source` starts with one of these prefixes never feed a summary of this
    space (counted as `inputs_excluded`). By default external context (`external:...`) is
    left out; `[]` lets every memory in."""


class SpaceSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A space's gates; a field left out takes its default."""

    write_gate: bool = True
    """A write of a key new to its subject, while that subject already has live memories of
    the same kind under other keys in this space, answers 409 `key-choice-required` listing
    them (reuse one, or resend with `new_key: true`). On by default: a writer who does not know
    the old key would otherwise leave the stale value live beside the new one."""
    evidence_gate: bool = False
    """Writes of kind `summary` or `decision` must cite at least one `derived_from` memory the
    writer can read (422 `evidence-required`). Off by default: plenty of decisions are stated,
    not derived, and a space opts in when it wants every one traceable."""
    max_unused_days: Annotated[int, msgspec.Meta(ge=1, le=MAX_UNUSED_DAYS_LIMIT)] | None = None
    """`memory.age_unused` expires this space's live memories that were neither written nor
    returned by a search or get for this many days (1..36500). Null (the default): memories
    never age out for being unused."""
    consolidation: ConsolidationPolicy = msgspec.field(default_factory=ConsolidationPolicy)
    """Cross-space summaries and the source policy of `memory.consolidate`."""
    review: bool = False
    """Writes into this space by a writer who is not one of its reviewers (a `review` grant on
    the space and a token with `review:memory`; never an agent or a delegated token) land as
    proposals: visible to their writer and the space's reviewers only, until a reviewer
    approves or rejects them (docs/concepts.md, "Review"). Off by default."""


DEFAULT = SpaceSettings()


def stored(raw: object) -> SpaceSettings:
    """The settings as stored (validated when written). Anything unreadable counts as the
    defaults, which keep both gates as safe as they come (the write gate on)."""
    try:
        return msgspec.convert(raw or {}, SpaceSettings)
    except msgspec.ValidationError:
        return DEFAULT


def to_stored(settings: SpaceSettings) -> dict[str, Any]:
    """What the column holds: only the fields that differ from the defaults (answers show
    every field). Source prefixes are stored normalized (`normalized_source`), once each."""
    policy = settings.consolidation
    prefixes = list(dict.fromkeys(normalized_source(p) for p in policy.excluded_sources))
    settings = msgspec.structs.replace(
        settings, consolidation=msgspec.structs.replace(policy, excluded_sources=prefixes)
    )
    given: dict[str, Any] = msgspec.to_builtins(settings)
    defaults: dict[str, Any] = msgspec.to_builtins(DEFAULT)
    return {name: value for name, value in given.items() if defaults[name] != value}
