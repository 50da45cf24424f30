"""ETags of memories and the `If-Match` precondition of changes (docs/concepts.md, "Safe
retries and edits").

A memory version's ETag is `"<id>.<version>"`: the version's own id (unique across every
memory of every tenant) and its number in its key's chain, so an ETag of one memory can never
match another's, and a client can read the version off it. It is strong: the value, key and
provenance of a version never change (a new value is a new version with a new id).

`If-Match` on a change names the live version of the key the change touches, the one it would
supersede or take down: a write's (space, subject, kind, key, audience), the key of the version
a revert brings back or a delete retracts. It holds when that live version's ETag is listed, or
for `*` when the key has a live version at all. It is evaluated under the key's lock, in the
change's transaction (service/memory/service.py), so of two changes naming the same ETag
exactly one holds; the other is 412 and changes nothing.

Approving a proposal is a change of its key: its `If-Match` names the live version the
proposal will supersede (not the proposal, which is no version of the key yet). Rejecting a
proposal, revoking and reinstating change one memory and supersede nothing: their `If-Match`
names that memory itself (`check_memory`).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from service.memory.repository import Version
from service.problems import InvalidRequest, PreconditionFailed

_TAG = re.compile(r'\s*(W/)?"([\x21\x23-\x7e]*)"\s*')
MAX_IF_MATCH_CHARS = 2000


def etag_of(memory_id: uuid.UUID, version: int) -> str:
    """The strong ETag of a memory version, quotes included (as the header carries it)."""
    return f'"{memory_id}.{version}"'


@dataclass(frozen=True)
class IfMatch:
    """A parsed `If-Match`: `*`, or the strong ETags it lists (weak ones never match)."""

    any_version: bool
    etags: frozenset[str]

    def holds(self, live: Version | None) -> bool:
        if live is None:
            return False
        return self.any_version or etag_of(live.id, live.version) in self.etags

    def check(self, live: Version | None) -> None:
        """412 unless the precondition holds for `live` (the key's live version, or None)."""
        if self.holds(live):
            return
        current = None if live is None else etag_of(live.id, live.version)
        now = (
            f"the live version now is {current}"
            if current
            else "the key has no live version you can see now"
        )
        raise PreconditionFailed(
            f"If-Match did not hold: {now}. Nothing was changed. Read the memory again "
            "(GET /v1/memories/{id}, or its history) and resend with its ETag if your change "
            "still applies.",
            current_etag=current,
        )


def check_memory(if_match: IfMatch | None, memory: Version) -> None:
    """412 unless `if_match` (when sent) names `memory` itself: the precondition of a change of
    one memory by id that supersedes nothing (reject a proposal, revoke, reinstate). A version's
    ETag never changes, so this refuses a change aimed at another version than the one the
    client read (e.g. a newer version of the key, or an older one)."""
    if if_match is None or if_match.any_version:
        return
    current = etag_of(memory.id, memory.version)
    if current in if_match.etags:
        return
    raise PreconditionFailed(
        f"If-Match did not hold: this memory's ETag is {current}. Nothing was changed. Read "
        "the memory again (GET /v1/memories/{id}) and resend with its ETag if your change "
        "still applies.",
        current_etag=current,
    )


def parse_if_match(raw: str | None) -> IfMatch | None:
    """`If-Match` as sent (None: no precondition). Malformed is 422 and changes nothing."""
    if raw is None:
        return None
    if raw.strip() == "*":
        return IfMatch(any_version=True, etags=frozenset())
    etags: set[str] = set()
    parts = raw.split(",") if len(raw) <= MAX_IF_MATCH_CHARS else []
    for part in parts:
        match = _TAG.fullmatch(part)
        if match is None:
            etags.clear()
            break
        if match[1] is None:  # If-Match compares strongly: a weak tag matches nothing
            etags.add(f'"{match[2]}"')
    else:
        if parts:
            return IfMatch(any_version=False, etags=frozenset(etags))
    raise InvalidRequest(
        'If-Match must be "*" or a comma-separated list of ETags as this API sends them '
        '(e.g. "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b.3", quotes included). Nothing was changed.',
        errors=[{"field": "If-Match", "source": "header", "message": "Expected * or ETags"}],
    )
