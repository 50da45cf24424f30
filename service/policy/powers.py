"""What a principal could do with admin scopes, so that nobody takes a role away from someone
whose powers exceed their own (review item 2: a `manage:policy`-only admin locked the tenant
owner out), and the role holders a tenant may never run out of."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.scopes import ADMIN_SCOPES, Scope
from service.db.models import CasbinRule, Client, RoleAssignment
from service.db.models import Principal as PrincipalRow
from service.policy.compile import CASBIN_MAX_HIERARCHY
from service.policy.rules import EXTERNAL_ADMIN, POLICY_ADMIN, principal_name


async def admin_powers(
    session: AsyncSession, tenant_id: uuid.UUID, principal_id: uuid.UUID
) -> frozenset[str]:
    """The admin scopes the principal's credentials may carry: those of its admin clients
    (disabled ones too: whoever may re-enable one holds them anyway), and every admin scope
    when its external IdP mapping is approved (the IdP decides which it puts in a token)."""
    row = await session.get(PrincipalRow, (tenant_id, principal_id))
    if row is None or row.kind == "agent":
        return frozenset()
    registered = await session.scalars(
        select(Client.allowed_scopes).where(
            Client.tenant_id == tenant_id,
            Client.principal_id == principal_id,
            Client.kind == "admin",
        )
    )
    powers = {scope for scopes in registered for scope in scopes} & ADMIN_SCOPES
    approved = await session.scalar(
        select(func.count())
        .select_from(CasbinRule)
        .where(
            CasbinRule.tenant_id == tenant_id,
            CasbinRule.ptype == "g",
            CasbinRule.v0 == principal_name(row.kind, row.id),
            CasbinRule.v1 == EXTERNAL_ADMIN,
        )
    )
    if approved and row.external_subject is not None:
        powers |= ADMIN_SCOPES
    return frozenset(powers)


# A policy admin counts only if it can still act as one: an enabled user or service reaching
# the role, with an enabled admin client carrying `manage:policy` or an approved external
# mapping to an issuer this deployment trusts (its IdP then decides what its tokens carry; a
# mapping to any other issuer, or one taken out of MEMGATE_EXTERNAL_ISSUERS, can never log in:
# red-team pass 2, F3). Agents never hold admin scopes, and a
# member without such credentials cannot manage anything (red-team: a tenant whose only
# "admins" were an agent and a client-less user let its last real admin disable itself).
# DISTINCT: one principal can reach the role along several chains.
_WORKING_POLICY_ADMINS = text(
    """
    WITH RECURSIVE members(name, depth) AS (
        SELECT CAST(:role AS text), 0
      UNION
        SELECT g.v0, m.depth + 1 FROM members m
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v1 = m.name
         WHERE m.depth < :max_depth
    )
    SELECT count(DISTINCT p.id) FROM principals p
      JOIN members m ON m.name = p.kind || ':' || p.id::text
     WHERE p.tenant_id = :tenant AND p.disabled_at IS NULL AND p.kind <> 'agent'
       AND (
            EXISTS (
                SELECT 1 FROM clients c
                 WHERE c.tenant_id = p.tenant_id AND c.principal_id = p.id
                   AND c.kind = 'admin' AND c.disabled_at IS NULL
                   AND CAST(:scope AS text) = ANY(c.allowed_scopes)
            )
         OR (
            p.external_subject IS NOT NULL
            AND p.external_issuer = ANY(CAST(:issuers AS text[]))
            AND EXISTS (
                SELECT 1 FROM casbin_rule a
                 WHERE a.tenant_id = p.tenant_id AND a.ptype = 'g'
                   AND a.v0 = p.kind || ':' || p.id::text AND a.v1 = :approval
            )
         )
       )
    """
)


async def working_policy_admins(
    session: AsyncSession, tenant_id: uuid.UUID, trusted_issuers: Collection[str]
) -> int:
    """Policy admins (directly or through teams) that can still manage the tenant's access:
    enabled users and services with a working admin credential (see the statement);
    `trusted_issuers`: the `iss` of the configured external issuers."""
    params = {
        "issuers": sorted(trusted_issuers),
        "tenant": tenant_id,
        "role": POLICY_ADMIN,
        "max_depth": CASBIN_MAX_HIERARCHY,
        "scope": str(Scope.MANAGE_POLICY),
        "approval": EXTERNAL_ADMIN,
    }
    return int((await session.execute(_WORKING_POLICY_ADMINS, params)).scalar_one())


async def auditor_count(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    """Enabled principals holding the auditor role."""
    found = await session.scalar(
        select(func.count())
        .select_from(RoleAssignment)
        .join(
            PrincipalRow,
            (PrincipalRow.tenant_id == RoleAssignment.tenant_id)
            & (PrincipalRow.id == RoleAssignment.principal_id),
        )
        .where(
            RoleAssignment.tenant_id == tenant_id,
            RoleAssignment.role == "auditor",
            PrincipalRow.disabled_at.is_(None),
        )
    )
    return int(found or 0)
