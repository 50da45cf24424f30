"""Wire shapes of the memory API (snake_case JSON; unknown fields are refused)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from service.db.types import NO_NUL, NOT_BLANK

# `$(?!\n)`: Python's $ also matches before a final newline, which would let "deploy.window\n"
# live beside "deploy.window" and never supersede it. (\Z would do in Python, but these patterns
# are published in openapi.yaml, and ECMA regex engines read \Z as a literal Z.)
SUBJECT_PATTERN = r"^[^\s\x00-\x1f]+$(?!\n)"
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$(?!\n)"

Kind = Literal["fact", "preference", "decision", "episode", "summary", "document"]
Status = Literal["live", "superseded", "expired", "retracted", "proposed", "hidden"]
"""`retracted`: deleted; only history shows it, as a content-free stub that keeps its number.
`proposed`: written into a reviewed space by a non-reviewer; only its writer and the space's
reviewers see it, until approved (then `live`, numbered) or rejected (then gone).
`hidden`: only in a write's answer: stored hidden by a standing revocation (docs/revocation.md)."""
OnRevoked = Literal["hide", "reject"]

AsOf = Annotated[
    datetime,
    msgspec.Meta(
        description='Valid time, "what was true then": the versions valid at this instant '
        "(with a time zone). Default: now."
    ),
]
KnownAt = Annotated[
    datetime,
    msgspec.Meta(
        description='Record time, "what did we know then": the versions memgate held at this '
        "instant (with a time zone). Default: now."
    ),
]
SearchMode = Literal["hybrid", "vector", "lexical"]

Subject = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=SUBJECT_PATTERN,
        description='Who or what the memory is about, e.g. "service:billing" or "user:42".',
    ),
]
Key = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=KEY_PATTERN,
        description='Stable name of the fact, e.g. "deploy.window"; same key = new version.',
    ),
]
Value = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        pattern=NOT_BLANK,
        description="The memory text: not blank, no NUL characters.",
    ),
]
TtlSeconds = Annotated[int, msgspec.Meta(ge=1, le=315_360_000)]
Confidence = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=1.0,
        description="How sure the writer is, 0 to 1: recorded and returned, never ranked on.",
    ),
]
Source = Annotated[str, msgspec.Meta(max_length=200, pattern=NO_NUL)]


class MemoryCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    subject: Subject
    kind: Kind
    key: Key
    value: Value
    ttl_seconds: TtlSeconds | None = None
    valid_from: datetime | None = None
    metadata: dict[str, Any] | None = None
    source: Source | None = None
    confidence: Confidence | None = None
    space_id: uuid.UUID | None = None
    derived_from: Annotated[list[uuid.UUID], msgspec.Meta(max_length=100)] = []
    """Memories this one was derived from (ids you can read). It is then visible only to
    those who can read every source: its `read_requires` holds their spaces."""
    new_key: bool = False
    """You mean a new key: skip the write gate (409 `key-choice-required`), which stops a key
    new to its subject while that subject has live memories of the same kind under other
    keys. Resend with this set only when none of the keys the 409 offered names this fact."""
    on_revoked: OnRevoked = "hide"
    """When the value (normalized) equals a memory revoked in the target space, or a source
    in `derived_from` is hidden by a revocation: `hide` (default) stores it hidden (201, status
    `hidden`, readable by nobody until that revocation is reinstated); `reject` answers 409
    `content-revoked` and writes nothing."""


class MemoryBatch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    items: Annotated[
        list[MemoryCreate],
        msgspec.Meta(
            min_length=1,
            description="Each item exactly the body of POST /v1/memories; 1 to "
            "MEMGATE_BATCH_MAX_ITEMS (default 500) of them, written in order, all or none.",
        ),
    ]


class SearchFilters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    subject: Subject | None = None
    kind: Kind | None = None
    key: Key | None = None
    space_id: uuid.UUID | None = None


class SearchRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    query: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=4096,
            pattern=NOT_BLANK,
            description="What to recall: not blank, no NUL characters.",
        ),
    ]
    k: int | None = None
    min_score: (
        Annotated[
            float,
            msgspec.Meta(
                ge=-1.0,
                le=1.0,
                description=(
                    "The cosine a hit must reach. Omitted: your tenant's score floor (0.25 "
                    "by default), so an unrelated query answers no hits. 0 (or less): no "
                    "floor. A hybrid hit may also enter on its words alone, when it holds at "
                    "least max(0.5, min_score) of the query's term weight."
                ),
            ),
        ]
        | None
    ) = None
    filters: SearchFilters | None = None
    as_of: AsOf | None = None
    known_at: KnownAt | None = None
    mode: Annotated[
        SearchMode,
        msgspec.Meta(
            description=(
                "hybrid (default): the vector and the full-text leg, fused by reciprocal rank; "
                "vector: by cosine only; lexical: by the query's words only."
            )
        ),
    ] = "hybrid"


class Provenance(msgspec.Struct, kw_only=True):
    """Who wrote a memory, how, from what, and who may read it. The memory's own fields carry
    the rest of its story: `status`, the valid interval (`valid_from`, `valid_until`) and the
    supersession links (`supersedes`, `superseded_by`)."""

    writer_id: uuid.UUID
    client_id: str
    act: dict[str, Any] | None
    """The delegation chain (RFC 8693 `act`) of the token that wrote it: the agent that acted
    for `writer_id`, if any."""
    source: str | None
    recorded_at: datetime
    """When memgate recorded this version (record time)."""
    superseded_at: datetime | None
    """When a later version replaced it (record time); null while it is current."""
    derived_from: list[uuid.UUID]
    """The sources you can read now (any version). Sources you cannot read (deleted, expired
    or revoked since) are left out and only counted in `derived_from_withheld`."""
    derived_from_withheld: int
    read_requires: list[uuid.UUID]
    """The audience: besides the memory's own space, every space a reader must be able to
    read (the spaces its sources came from). Empty: whoever reads the space reads it."""
    embedding_model: str


class MemoryOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    space_id: uuid.UUID
    subject: str
    kind: str
    key: str
    value: str
    status: Status
    valid_from: datetime
    valid_until: datetime | None
    expires_at: datetime | None
    supersedes: uuid.UUID | None
    superseded_by: uuid.UUID | None
    metadata: dict[str, Any]
    version: int
    """0 while `proposed`: a proposal is numbered when it is approved."""
    etag: Annotated[
        str,
        msgspec.Meta(
            description='This version\'s strong ETag, `"<id>.<version>"` (also the `ETag` header '
            "of a get or write). Send it as `If-Match` (MCP: `if_match`) to change the key only "
            "while this version is its live one."
        ),
    ]
    provenance: Provenance
    confidence: float | None = None
    """How sure the writer said it was (0..1), if it said."""
    retracted_at: datetime | None = None
    """When the version was deleted (status `retracted`: value "", metadata {}, no source)."""


class AudienceNarrowing(msgspec.Struct, kw_only=True):
    """A write whose sources make it readable by fewer principals than its space."""

    required_spaces: list[uuid.UUID]
    """Spaces besides the memory's own that a reader must also be able to read."""
    writer_only: bool
    """One of them is your personal space: nobody but you (and agents acting for you) can
    read this memory, whoever else reads its space."""
    detail: str


class RevertNote(msgspec.Struct, kw_only=True):
    """What a revert changed besides the value: the sources it could not carry over."""

    sources_dropped: int
    """How many of the reverted version's sources you can no longer read (deleted, expired,
    revoked or out of your reach since): the new version does not cite them. Its audience
    (`read_requires`) stays the reverted version's all the same: the value was derived from
    them too."""
    detail: str


class HiddenNote(msgspec.Struct, kw_only=True):
    because: Literal["content-revoked", "derived-from-hidden"]
    detail: str


class MemoryWritten(msgspec.Struct, kw_only=True):
    memory: MemoryOut
    superseded: list[uuid.UUID]
    audience_narrowed: AudienceNarrowing | None = None
    """Set when `derived_from` narrowed who may read the memory below its space's readers;
    write from other sources (or into the narrower space) if that is not what you meant."""
    reverted: RevertNote | None = None
    """Set by a revert that could not cite every source of the version it brought back."""
    hidden: HiddenNote | None = None
    """Set when the memory was stored hidden (status `hidden`): a standing revocation covers
    its content or one of its sources. No reader gets it until that revocation is lifted."""


class MemoryBatchWritten(msgspec.Struct, kw_only=True):
    items: list[MemoryWritten]
    """Per item, in order, exactly the answer of POST /v1/memories."""
    count: int


class MemoryPage(msgspec.Struct, kw_only=True):
    items: list[MemoryOut]
    next_cursor: str | None


class MemoryHistory(msgspec.Struct, kw_only=True):
    items: list[MemoryOut]
    """The chain newest first, from its newest version you can see; it ends at the first
    version you cannot see (never skipping over one). Deleted versions are stubs."""
    next_cursor: str | None
    """Older versions follow: pass it back as `cursor`."""


GroupBy = Literal["kind", "space", "subject"]


class CountGroup(msgspec.Struct, kw_only=True):
    value: str
    """The kind, space id or subject of this group."""
    count: int


class MemoryCounts(msgspec.Struct, kw_only=True):
    total: int
    """Live memories visible to you that match the filters."""
    group_by: GroupBy | None
    groups: list[CountGroup]
    """The largest groups first (ties by value); at most `max_groups`."""
    more_groups: bool
    """True when groups beyond `max_groups` exist; narrow the filters to see them."""


class SearchHit(msgspec.Struct, kw_only=True):
    score: float | None
    """Cosine similarity of the hit to the query, in every mode (what `min_score` compares).
    Null only for a hit found by its words whose vector was made by another embedding model
    than the query's (while `embeddings.reembed` runs: docs/jobs.md)."""
    memory: MemoryOut
    lexical_score: float | None = None
    """Share of the query's term weight the hit holds (0..1, terms weighted by how rare they
    are among the memories you see); null when it holds no term, or in vector mode."""
    fused_score: float | None = None
    """The hit's reciprocal-rank-fusion value, sum of 1 / (60 + rank) over the legs that
    ranked it (hybrid), or 1 / (60 + its lexical rank) (lexical); hits are in its order.
    Null in vector mode, where hits are in `score` order."""


class SearchResult(msgspec.Struct, kw_only=True):
    hits: list[SearchHit]
    k: int
    min_score: float | None
    """The cosine floor that applied (the request's, else the tenant's default); null: none."""
