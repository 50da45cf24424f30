"""Revoke and reinstate. No HTTP types, no commits: the call owns the transaction.

Revoking hides, in the same transaction: the memory (the version named), every memory of its
space whose normalized content equals it, and every memory whose `derived_from` reaches one of
those, transitively, in any space. The hidden state is materialised (`memories.revoked_at`,
with one `memory_hidings` row per cause), so every read keeps Visible's one clause. Later
writes it covers are stored hidden (service/memory/service.py `_born_hidden`). Only
reinstating the revoked memory itself lifts it; a row hidden for two causes stays hidden
until both are lifted. docs/revocation.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Facts
from service.db.base import uuid7
from service.memory.etags import IfMatch, check_memory
from service.memory.normalize import QUOTE_RUN, quotes
from service.memory.problems import MemoryNotFound
from service.memory.repository import Version
from service.memory.service import not_found_detail
from service.policy.visible import Action, Visible, visible
from service.revocation import repository
from service.revocation.problems import (
    MemoryAlreadyHidden,
    MemoryNotRevoked,
    NotTheRevokedMemory,
    ReasonQuotesContent,
)
from service.revocation.schemas import Reinstated, Revoked


class RevocationService:
    def __init__(self, session: AsyncSession, *, facts: Facts) -> None:
        self._session = session
        self._facts = facts

    async def revoke(
        self,
        principal: Principal,
        memory_id: uuid.UUID,
        reason: str,
        if_match: IfMatch | None = None,
    ) -> Revoked:
        """`if_match`: only while it names this memory (checked under the revocation lock,
        held alone, in the revoke's transaction)."""
        await repository.hold_out_writes(self._session, principal.tenant_id)
        scope = visible(principal, Action.DELETE)
        found = await self._target(scope, memory_id)
        check_memory(if_match, Version(found.id, found.version))
        if found.hidden:
            standing = await repository.standing_of(self._session, principal.tenant_id, found.id)
            causes = [found.id] if standing else await self._causes(principal, found.id)
            raise MemoryAlreadyHidden(
                f"Memory {found.id} is "
                + (
                    "revoked already."
                    if standing
                    else "hidden already, by the revocation of "
                    + (", ".join(map(str, causes)) or "a memory you may not manage")
                    + "."
                )
                + " Nothing changed.",
                revoked_memory_ids=[str(one) for one in causes],
            )
        _refuse_quoting(reason, found.value)
        revocation_id = uuid7()
        revoked_at, hidden = await repository.revoke(
            self._session,
            tenant_id=principal.tenant_id,
            revocation_id=revocation_id,
            memory_id=found.id,
            space_id=found.space_id,
            content_hash=found.content_hash,
            reason=reason,
            revoked_by=principal.principal_id,
        )
        # Ids and counts only: the reason is content-like and stays on the revocation row.
        self._facts.add_targets([found.id, *(one for one in hidden if one != found.id)])
        self._facts.count(len(hidden))
        return Revoked(
            revocation_id=revocation_id,
            memory_id=found.id,
            revoked_at=revoked_at,
            revoked_by=principal.principal_id,
            hidden=await self._readable(principal, hidden),
        )

    async def reinstate(
        self,
        principal: Principal,
        memory_id: uuid.UUID,
        reason: str,
        if_match: IfMatch | None = None,
    ) -> Reinstated:
        """`if_match`: only while it names this memory (checked as revoke checks it)."""
        await repository.hold_out_writes(self._session, principal.tenant_id)
        scope = visible(principal, Action.DELETE)
        found = await self._target(scope, memory_id)
        check_memory(if_match, Version(found.id, found.version))
        standing = await repository.standing_of(self._session, principal.tenant_id, found.id)
        if standing is None:
            if not found.hidden:
                raise MemoryNotRevoked(
                    f"Memory {found.id} is not revoked or hidden; nothing to reinstate. "
                    "Nothing changed."
                )
            causes = await self._causes(principal, found.id)
            raise NotTheRevokedMemory(
                f"Memory {found.id} is hidden because another memory was revoked (it has the "
                "same content, or derives from it). Only reinstating that memory brings it "
                "back: "
                + (", ".join(map(str, causes)) or "one you may not manage")
                + ". Nothing changed.",
                reinstate=[str(one) for one in causes],
            )
        _refuse_quoting(reason, found.value)
        reinstated_at, back = await repository.reinstate(
            self._session,
            principal.tenant_id,
            standing.id,
            reinstated_by=principal.principal_id,
            reason=reason,
        )
        self._facts.add_targets([found.id, *(one for one in back if one != found.id)])
        self._facts.count(len(back))
        return Reinstated(
            revocation_id=standing.id,
            memory_id=found.id,
            revoked_at=standing.revoked_at,
            reinstated_at=reinstated_at,
            reinstated_by=principal.principal_id,
            restored=await self._readable(principal, back),
        )

    async def _readable(self, principal: Principal, memory_ids: Sequence[uuid.UUID]) -> int:
        """The answer counts only rows the caller reads (red-team finding 5): a derived row in
        a space it cannot read must not show as one more in the count."""
        readable = visible(principal, Action.READ)
        return len(await repository.reachable(self._session, readable, memory_ids))

    async def _target(self, scope: Visible, memory_id: uuid.UUID) -> repository.Target:
        found = await repository.target(self._session, scope, memory_id)
        if found is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        return found

    async def _causes(self, principal: Principal, memory_id: uuid.UUID) -> list[uuid.UUID]:
        """The revoked memories hiding `memory_id` that the caller may manage (others are
        not named: their ids would tell of rows the caller cannot read)."""
        causes = await repository.revoked_memories_hiding(
            self._session, principal.tenant_id, memory_id
        )
        return await repository.reachable(self._session, visible(principal, Action.DELETE), causes)


def _refuse_quoting(reason: str, value: str) -> None:
    if quotes(reason, value):
        raise ReasonQuotesContent(
            f"The reason repeats {QUOTE_RUN} or more consecutive words of the memory's value "
            "(or all the words of a shorter one). "
            "It is kept with the revocation and shown to those who manage it, so it may not "
            "carry the content: say why, not what (e.g. 'superseded by policy 2026-11'). "
            "Nothing changed.",
            max_quoted_words=QUOTE_RUN - 1,
        )
