"""Casbin rules → compiled grants, in SQL, in the transaction that changed the rules.

Two closures (migration 20261130_grant_closures): `principal_roles`, every team or role each
principal reaches through `g` links, and `role_grants`, every space each `p` rule reaches
through `g2` links. The view `space_grants` joins them; requests read that.

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

from service.policy.rules import Rule

CASBIN_MAX_HIERARCHY = 10
"""pycasbin's default `max_hierarchy_level`, mirrored so compile and enforce agree."""

# NO KEY UPDATE: a transaction that just inserted a principal or space holds KEY SHARE on the
# tenant row (its foreign key); FOR UPDATE would conflict with that and deadlock two creations.
_LOCK_TENANT = text(
    "SELECT policy_version FROM tenants WHERE tenant_id = :tenant FOR NO KEY UPDATE"
)
# The principals whose roles can depend on `g` rules about `member`: those that reach it
# through `g` links (the member itself when it is a principal).
_AFFECTED = text(
    """
    WITH RECURSIVE back(member, depth) AS (
        SELECT CAST(:member AS text), 0
      UNION
        SELECT g.v0, b.depth + 1 FROM back b
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v1 = b.member
         WHERE b.depth < :max_depth
    )
    SELECT p.id FROM principals p
     WHERE p.tenant_id = :tenant AND p.kind || ':' || p.id::text IN (SELECT member FROM back)
    """
)
_CLEAR_ROLES = text(
    "DELETE FROM principal_roles WHERE tenant_id = :tenant "
    "AND (CAST(:only AS uuid[]) IS NULL OR principal_id = ANY(CAST(:only AS uuid[])))"
)
_COMPILE_ROLES = text(
    """
    WITH RECURSIVE roles(principal_id, role, depth) AS (
        SELECT p.id, p.kind || ':' || p.id::text, 0
          FROM principals p
         WHERE p.tenant_id = :tenant
           AND (CAST(:only AS uuid[]) IS NULL OR p.id = ANY(CAST(:only AS uuid[])))
      UNION
        SELECT r.principal_id, g.v1, r.depth + 1
          FROM roles r
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v0 = r.role
         WHERE r.depth < :max_depth
    )
    INSERT INTO principal_roles (tenant_id, principal_id, role)
    SELECT DISTINCT :tenant, principal_id, role FROM roles
    """
)
_CLEAR_GRANTS = text(
    "DELETE FROM role_grants WHERE tenant_id = :tenant "
    "AND (CAST(:only AS text[]) IS NULL OR role = ANY(CAST(:only AS text[])))"
)
# Each `p` rule, walked down `g2` links (child v0 → parent v1) to every sub-space under its
# space: the same reach as following a space's parents up to the rule, from the other end.
_COMPILE_GRANTS = text(
    """
    WITH RECURSIVE reach(role, action, obj, depth) AS (
        SELECT p.v0, p.v3, p.v2, 0
          FROM casbin_rule p
         WHERE p.tenant_id = :tenant AND p.ptype = 'p'
           AND (CAST(:only AS text[]) IS NULL OR p.v0 = ANY(CAST(:only AS text[])))
      UNION
        SELECT r.role, r.action, e.v0, r.depth + 1
          FROM reach r
          JOIN casbin_rule e ON e.tenant_id = :tenant AND e.ptype = 'g2' AND e.v1 = r.obj
         WHERE r.depth < :max_depth
    )
    INSERT INTO role_grants (tenant_id, role, action, space_id)
    SELECT DISTINCT :tenant, r.role, r.action, s.id
      FROM reach r
      JOIN spaces s ON s.tenant_id = :tenant AND r.obj = 'space:' || s.id::text
    """
)
# A leaf under a parent holds exactly the parent's grants, one link further from each rule:
# exact while chains stay within the API's 8 links (pycasbin follows 10).
_IS_NEW_LEAF = text(
    """
    SELECT EXISTS (SELECT 1 FROM casbin_rule WHERE tenant_id = :tenant AND ptype = 'g2'
                      AND v0 = :child AND v1 = :parent)
       AND (SELECT count(*) FROM casbin_rule WHERE tenant_id = :tenant
              AND ((ptype = 'p' AND v2 = :child) OR (ptype = 'g2' AND (v1 = :child
                   OR (v0 = :child AND v1 <> :parent))))) = 0
       AND NOT EXISTS (SELECT 1 FROM role_grants WHERE tenant_id = :tenant
                          AND space_id = CAST(:child_id AS uuid))
    """
)
_INHERIT = text(
    "INSERT INTO role_grants (tenant_id, role, action, space_id) "
    "SELECT tenant_id, role, action, CAST(:child_id AS uuid) FROM role_grants "
    "WHERE tenant_id = :tenant AND space_id = CAST(:parent_id AS uuid)"
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
    session: AsyncSession,
    tenant_id: uuid.UUID,
    principal: tuple[uuid.UUID, str],
    space_id: uuid.UUID,
) -> int:
    """A new principal (id, typed name) with read/write/delete on its new personal space,
    without recompiling anything: no other rule names either of them yet, so these rows are
    exactly what a full compile would add (a test compares the two)."""
    principal_id, name = principal
    await session.execute(
        text(
            "INSERT INTO principal_roles (tenant_id, principal_id, role) "
            "VALUES (:tenant, :principal, :name)"
        ),
        {"tenant": tenant_id, "principal": principal_id, "name": name},
    )
    await session.execute(
        text(
            "INSERT INTO role_grants (tenant_id, role, action, space_id) "
            "SELECT :tenant, :name, action, :space "
            "FROM unnest(ARRAY['read', 'write', 'delete']) AS action"
        ),
        {"tenant": tenant_id, "name": name, "space": space_id},
    )
    return await bump_version(session, tenant_id)


async def recompile(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    """Rebuild the tenant's compiled grants from its rules; returns the new policy version. The
    caller holds `lock_policy` and owns the transaction."""
    await _rebuild_roles(session, tenant_id, None)
    await _rebuild_grants(session, tenant_id, None)
    return await bump_version(session, tenant_id)


async def apply_changes(
    session: AsyncSession, tenant_id: uuid.UUID, changed: Sequence[Rule]
) -> int:
    """Rebuild only what the changed rules can reach; returns the new policy version.

    - `g` (membership): the roles of the principals that reach the member;
    - `p` (grant): that subject's grants;
    - `g2` (sub-space): a new leaf space (no rule names it yet) under a parent inherits the
      parent's grants; any other `g2` change rebuilds every rule's grants (rules by spaces,
      never by members).

    Nothing is a member-by-space product any more, so a grant to a large team over a large tree
    writes one row per space (bench/policy.py; a test compares the result with a full compile).
    """
    members = sorted({rule.subject for rule in changed if rule.ptype == "g"})
    if members:
        affected: set[uuid.UUID] = set()
        for member in members:
            params = {"tenant": tenant_id, "member": member, "max_depth": CASBIN_MAX_HIERARCHY}
            affected.update(await session.scalars(_AFFECTED, params))
        await _rebuild_roles(session, tenant_id, sorted(affected))
    sub_spaces = [rule for rule in changed if rule.ptype == "g2"]
    if sub_spaces and not await _only_new_leaves(session, tenant_id, sub_spaces):
        await _rebuild_grants(session, tenant_id, None)
    elif sub_spaces:
        for rule in sub_spaces:
            await session.execute(_INHERIT, _leaf_params(tenant_id, rule))
    if subjects := sorted({rule.subject for rule in changed if rule.ptype == "p"}):
        await _rebuild_grants(session, tenant_id, subjects)
    return await bump_version(session, tenant_id)


async def _only_new_leaves(
    session: AsyncSession, tenant_id: uuid.UUID, sub_spaces: list[Rule]
) -> bool:
    """Every rule is an added `g2` link from a space no other rule names: a new leaf."""
    for rule in sub_spaces:
        if not await session.scalar(_IS_NEW_LEAF, _leaf_params(tenant_id, rule)):
            return False
    return True


def _leaf_params(tenant_id: uuid.UUID, rule: Rule) -> dict[str, object]:
    return {
        "tenant": tenant_id,
        "child": rule.subject,
        "parent": rule.target,
        "child_id": rule.subject.removeprefix("space:"),
        "parent_id": rule.target.removeprefix("space:"),
    }


async def _rebuild_roles(
    session: AsyncSession, tenant_id: uuid.UUID, only: list[uuid.UUID] | None
) -> None:
    params = {"tenant": tenant_id, "max_depth": CASBIN_MAX_HIERARCHY, "only": only}
    await session.execute(_CLEAR_ROLES, params)
    await session.execute(_COMPILE_ROLES, params)


async def _rebuild_grants(
    session: AsyncSession, tenant_id: uuid.UUID, only: list[str] | None
) -> None:
    params = {"tenant": tenant_id, "max_depth": CASBIN_MAX_HIERARCHY, "only": only}
    await session.execute(_CLEAR_GRANTS, params)
    await session.execute(_COMPILE_GRANTS, params)


async def bump_version(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    version = (await session.execute(_BUMP, {"tenant": tenant_id})).scalar_one()
    await session.execute(
        text("SELECT pg_notify('memgate_policy', :payload)"),
        {"payload": f"{tenant_id}:{version}"},
    )
    return int(version)
