"""What a principal could do with admin scopes, so that nobody takes a role away from someone
whose powers exceed their own (review item 2: a `manage:policy`-only admin locked the tenant
owner out), and the role holders a tenant may never run out of."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import exists, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.scopes import ADMIN_SCOPES, Scope
from service.db.models import CasbinRule, Client, PrincipalRole
from service.db.models import Principal as PrincipalRow
from service.policy.rules import AUDITOR, EXTERNAL_ADMIN, POLICY_ADMIN, principal_name


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


async def holds_role(
    session: AsyncSession, tenant_id: uuid.UUID, principal_id: uuid.UUID, role: str
) -> bool:
    """Whether the principal reaches `role` (directly or through teams and roles): one primary
    key lookup in the compiled closure, which every policy change rebuilds in its own
    transaction, so a grant or removal counts from the very next request."""
    found = await session.scalar(
        select(
            exists().where(
                PrincipalRole.tenant_id == tenant_id,
                PrincipalRole.principal_id == principal_id,
                PrincipalRole.role == role,
            )
        )
    )
    return bool(found)


# A role holder counts only if it can still act in the role: an enabled user or service
# reaching it, with an enabled admin client carrying the role's scope (`manage:policy` for a
# policy admin, `read:audit` for an auditor) or an approved external mapping to an issuer this
# deployment trusts or the tenant registered (its IdP then decides what its tokens carry; a
# mapping to any other issuer, or one taken out of MEMGATE_EXTERNAL_ISSUERS, can never log in:
# red-team pass 2, F3). Agents never hold admin scopes, and a member without such credentials
# cannot act (red-team: a tenant whose only "admins" were an agent and a client-less user let
# its last real admin disable itself; the same held for auditors until the auditor rule used
# this statement too).
# Who reaches the role is read from the compiled closure (one row per principal and role, so
# nobody is counted twice however many chains lead there); the caller has rebuilt it for the
# change being checked. The approval stays a direct line, as everywhere it is read.
_WORKING_ROLE_HOLDERS = text(
    """
    SELECT count(*) FROM principal_roles r
      JOIN principals p ON p.tenant_id = r.tenant_id AND p.id = r.principal_id
     WHERE r.tenant_id = :tenant AND r.role = :role
       AND p.disabled_at IS NULL AND p.kind <> 'agent'
       AND (
            EXISTS (
                SELECT 1 FROM clients c
                 WHERE c.tenant_id = p.tenant_id AND c.principal_id = p.id
                   AND c.kind = 'admin' AND c.disabled_at IS NULL
                   AND CAST(:scope AS text) = ANY(c.allowed_scopes)
            )
         OR (
            p.external_subject IS NOT NULL
            -- The registration that verifies this mapping's tokens: a tenant registers an
            -- `iss` once (uq_tenant_issuers_tenant_id_issuer), so no decoy of the same `iss`
            -- with another audience can keep a mapping "working" (red-team F2).
            AND (p.external_issuer = ANY(CAST(:issuers AS text[]))
                 OR EXISTS (SELECT 1 FROM tenant_issuers i
                             WHERE i.tenant_id = p.tenant_id AND i.issuer = p.external_issuer))
            AND EXISTS (
                SELECT 1 FROM casbin_rule a
                 WHERE a.tenant_id = p.tenant_id AND a.ptype = 'g'
                   AND a.v0 = p.kind || ':' || p.id::text AND a.v1 = :approval
            )
         )
       )
    """
)


async def _working_role_holders(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    trusted_issuers: Collection[str],
    role: str,
    scope: Scope,
) -> int:
    params = {
        "issuers": sorted(trusted_issuers),
        "tenant": tenant_id,
        "role": role,
        "scope": str(scope),
        "approval": EXTERNAL_ADMIN,
    }
    return int((await session.execute(_WORKING_ROLE_HOLDERS, params)).scalar_one())


async def working_policy_admins(
    session: AsyncSession, tenant_id: uuid.UUID, trusted_issuers: Collection[str]
) -> int:
    """Policy admins (directly or through teams) that can still manage the tenant's access:
    enabled users and services with a working admin credential holding `manage:policy` (see
    the statement); `trusted_issuers`: the `iss` of the configured external issuers. Reads the
    compiled closure: after a rule change, call it once the change is compiled."""
    return await _working_role_holders(
        session, tenant_id, trusted_issuers, POLICY_ADMIN, Scope.MANAGE_POLICY
    )


async def working_auditors(
    session: AsyncSession, tenant_id: uuid.UUID, trusted_issuers: Collection[str]
) -> int:
    """Auditors (directly or through teams) that can still read the audit log: enabled users
    and services with a working admin credential holding `read:audit`. Same statement and
    timing rule as `working_policy_admins`."""
    return await _working_role_holders(
        session, tenant_id, trusted_issuers, AUDITOR, Scope.READ_AUDIT
    )


# Who an issuer's tokens would speak for: the tenant's principals mapped to that `iss` (disabled
# ones too, they can be enabled again), and whether any of them is an admin (its mapping
# approved, or reaching role:policy_admin or role:auditor). One registration per `iss` in a
# tenant, so these are exactly the principals of the registration that verifies that `iss`.
_MAPPED_TO_ISSUER = text(
    """
    SELECT count(*) AS mapped,
           coalesce(bool_or(
               EXISTS (SELECT 1 FROM casbin_rule a
                        WHERE a.tenant_id = p.tenant_id AND a.ptype = 'g'
                          AND a.v0 = p.kind || ':' || p.id::text AND a.v1 = :approval)
            OR EXISTS (SELECT 1 FROM principal_roles r
                        WHERE r.tenant_id = p.tenant_id AND r.principal_id = p.id
                          AND r.role = ANY(CAST(:roles AS text[])))
           ), false) AS admin
      FROM principals p
     WHERE p.tenant_id = :tenant AND p.external_issuer = :issuer
    """
)


async def mapped_to_issuer(
    session: AsyncSession, tenant_id: uuid.UUID, issuer: str
) -> tuple[int, bool]:
    """(how many principals of the tenant are mapped to `issuer`, whether one is an admin):
    whoever holds the keys of that issuer's registration acts as them."""
    params = {
        "tenant": tenant_id,
        "issuer": issuer,
        "approval": EXTERNAL_ADMIN,
        "roles": [POLICY_ADMIN, AUDITOR],
    }
    row = (await session.execute(_MAPPED_TO_ISSUER, params)).one()
    return int(row.mapped), bool(row.admin)
