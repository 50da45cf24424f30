"""Casbin rules → `space_grants`, in SQL, in the transaction that changed the rules.

The semantics are policies/memgate_model.conf as pycasbin evaluates it (a property test checks
the compiled grants against `enforce()` on random policies): a principal holds `action` on a
space when a `p` rule grants it to the principal or to a team/role the principal reaches through
`g` edges, on that space or on an ancestor it reaches through `g2` edges. pycasbin's role
managers follow at most 10 links; the policy API refuses chains longer than 8, so the cap below
never cuts a chain the API let in.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

CASBIN_MAX_HIERARCHY = 10
"""pycasbin's default `max_hierarchy_level`, mirrored so compile and enforce agree."""

# NO KEY UPDATE: a transaction that just inserted a principal or space holds KEY SHARE on the
# tenant row (its foreign key); FOR UPDATE would conflict with that and deadlock two creations.
_LOCK_TENANT = text(
    "SELECT policy_version FROM tenants WHERE tenant_id = :tenant FOR NO KEY UPDATE"
)
_CLEAR = text(
    "DELETE FROM space_grants WHERE tenant_id = :tenant "
    "AND (CAST(:only AS uuid[]) IS NULL OR principal_id = ANY(CAST(:only AS uuid[])))"
)
# The principals whose grants can depend on rules about `subject`: those that reach it through
# `g` links (the subject itself when it is a principal).
_AFFECTED = text(
    """
    WITH RECURSIVE back(member, depth) AS (
        SELECT CAST(:subject AS text), 0
      UNION
        SELECT g.v0, b.depth + 1 FROM back b
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v1 = b.member
         WHERE b.depth < :max_depth
    )
    SELECT p.id FROM principals p
     WHERE p.tenant_id = :tenant AND p.kind || ':' || p.id::text IN (SELECT member FROM back)
    """
)
_COMPILE = text(
    """
    WITH RECURSIVE
    roles(principal_id, role, depth) AS (
        SELECT p.id, p.kind || ':' || p.id::text, 0
          FROM principals p
         WHERE p.tenant_id = :tenant
           AND (CAST(:only AS uuid[]) IS NULL OR p.id = ANY(CAST(:only AS uuid[])))
      UNION
        SELECT r.principal_id, g.v1, r.depth + 1
          FROM roles r
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v0 = r.role
         WHERE r.depth < :max_depth
    ),
    ancestors(space_id, obj, depth) AS (
        SELECT s.id, 'space:' || s.id::text, 0
          FROM spaces s WHERE s.tenant_id = :tenant
      UNION
        SELECT a.space_id, e.v1, a.depth + 1
          FROM ancestors a
          JOIN casbin_rule e ON e.tenant_id = :tenant AND e.ptype = 'g2' AND e.v0 = a.obj
         WHERE a.depth < :max_depth
    )
    INSERT INTO space_grants (tenant_id, principal_id, action, space_id)
    SELECT DISTINCT :tenant, r.principal_id, p.v3, a.space_id
      FROM roles r
      JOIN casbin_rule p ON p.tenant_id = :tenant AND p.ptype = 'p' AND p.v0 = r.role
      JOIN ancestors a ON a.obj = p.v2
    """
)
_BUMP = text(
    "UPDATE tenants SET policy_version = policy_version + 1 WHERE tenant_id = :tenant "
    "RETURNING policy_version"
)


async def lock_policy(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    """Serialise the tenant's policy changes: the second writer waits, then compiles from a
    snapshot that holds the first writer's rules (each statement reads what is committed). A
    change may not hold the lock for long: compiling a huge tenant fails rather than stalls."""
    await session.execute(text("SET LOCAL statement_timeout = '30s'"))
    await session.execute(_LOCK_TENANT, {"tenant": tenant_id})


async def add_own_grants(
    session: AsyncSession, tenant_id: uuid.UUID, principal_id: uuid.UUID, space_id: uuid.UUID
) -> int:
    """A new principal's read/write/delete on its new personal space, without recompiling the
    tenant: no other rule names either of them yet, so these three rows are exactly what a full
    compile would add (the property test covers the compiler; a test compares the two)."""
    await session.execute(
        text(
            "INSERT INTO space_grants (tenant_id, principal_id, action, space_id) "
            "SELECT :tenant, :principal, action, :space "
            "FROM unnest(ARRAY['read', 'write', 'delete']) AS action"
        ),
        {"tenant": tenant_id, "principal": principal_id, "space": space_id},
    )
    return await bump_version(session, tenant_id)


async def recompile(
    session: AsyncSession, tenant_id: uuid.UUID, *, subjects: Sequence[str] | None = None
) -> int:
    """Rebuild the tenant's grants from its rules; returns the new policy version. The caller
    holds `lock_policy` and owns the transaction. With `subjects` (the names whose rules
    changed), only the principals that reach one of them are rebuilt: adding a member to a team
    rebuilds that member, not the tenant (a test compares this with a full compile)."""
    only: list[uuid.UUID] | None = None
    if subjects is not None:
        found: set[uuid.UUID] = set()
        for subject in subjects:
            rows = await session.scalars(
                _AFFECTED,
                {"tenant": tenant_id, "subject": subject, "max_depth": CASBIN_MAX_HIERARCHY},
            )
            found.update(rows)
        only = sorted(found)
    params = {"tenant": tenant_id, "max_depth": CASBIN_MAX_HIERARCHY, "only": only}
    await session.execute(_CLEAR, params)
    await session.execute(_COMPILE, params)
    return await bump_version(session, tenant_id)


async def bump_version(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    version = (await session.execute(_BUMP, {"tenant": tenant_id})).scalar_one()
    await session.execute(
        text("SELECT pg_notify('memgate_policy', :payload)"),
        {"payload": f"{tenant_id}:{version}"},
    )
    return int(version)
