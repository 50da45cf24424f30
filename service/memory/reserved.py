"""What only memgate's own jobs write: the (kind, key) pairs of consolidation summaries and the
`memgate:` sources. A principal writing there could pose as the job (a forged summary the job
would count as its own, or a source the policy trusts), so the write path refuses it."""

from __future__ import annotations

from service.policy.space_settings import normalized_source

SUMMARY_KIND = "summary"
SCOPE_KEY = "consolidation"
"""The key of a per-scope summary: one live version per (space, subject, audience)."""
ACROSS_KEY = "consolidation.across"
"""The key of a cross-space summary (in the space whose policy asked for it)."""
RESERVED_KEYS = (SCOPE_KEY, ACROSS_KEY)
"""The keys of kind `summary` only the consolidation job writes."""
SOURCE_PREFIX = "memgate:"
"""The sources of memgate's own jobs (compared normalized)."""
OUTPUT_SOURCE = "memgate:consolidation"
"""The `source` of every summary the consolidation job writes."""


def reserved(kind: str, key: str, source: str | None) -> bool:
    """A principal may not write this: a job's (kind, key) or a job's source."""
    if kind == SUMMARY_KIND and key in RESERVED_KEYS:
        return True
    return source is not None and normalized_source(source).startswith(SOURCE_PREFIX)
