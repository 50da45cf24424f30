"""Policy lines as the service writes them: typed, exact names and nothing else.

A name is `user:`, `agent:`, `service:`, `team:` or `space:` followed by a lowercase UUID, or
`role:<lowercase word>`. No wildcards, commas or key-match patterns can get in, so what pycasbin
would evaluate and what the SQL compiler computes cannot drift apart on a clever string.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import delete, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import CasbinRule

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
NAME = re.compile(rf"(?:(?:user|agent|service|team|space):{_UUID}|role:[a-z][a-z0-9_]{{0,62}})")
MAX_CHAIN = 8
"""Longest chain of `g` (membership) or `g2` (sub-space) links the API accepts."""
ACTIONS = ("read", "write", "delete")
"""What a principal holds on its personal space. `review` (docs/concepts.md, "Review") is
granted only by a rule."""
POLICY_ADMIN = "role:policy_admin"
"""Members (directly or through teams) may change the tenant's policy (with `manage:policy`)."""
AUDITOR = "role:auditor"
"""Members (directly or through teams) may read, export and verify the tenant's audit log (with
`read:audit`). Granted through `PUT /v1/principals/{id}/roles/auditor`, which checks the
granter holds `read:audit` itself."""
ERASER = "role:eraser"
"""Members (directly or through teams) may plan, execute and prove erasures (with
`manage:erasure`). Granted through `PUT /v1/principals/{id}/roles/eraser`, which checks the
granter holds `manage:erasure` itself; never seeded, so erasing takes a deliberate grant."""
EXTERNAL_ADMIN = "role:external_admin"
"""A principal mapped to an external IdP subject whose IdP tokens may carry admin scopes. Only
a direct link counts, and only a caller holding every admin scope sets or removes it."""

Ptype = Literal["p", "g", "g2"]


def principal_name(kind: str, principal_id: uuid.UUID) -> str:
    return f"{kind}:{principal_id}"


def space_name(space_id: uuid.UUID) -> str:
    return f"space:{space_id}"


@dataclass(frozen=True)
class Rule:
    ptype: Ptype
    subject: str
    target: str
    """`p`: the space; `g`: the team or role; `g2`: the parent space."""
    action: str | None = None

    def row(self, tenant_id: uuid.UUID) -> dict[str, object]:
        domain = str(tenant_id)
        if self.ptype == "p":
            return {
                "tenant_id": tenant_id,
                "ptype": "p",
                "v0": self.subject,
                "v1": domain,
                "v2": self.target,
                "v3": self.action,
            }
        return {
            "tenant_id": tenant_id,
            "ptype": self.ptype,
            "v0": self.subject,
            "v1": self.target,
            "v2": domain,
            "v3": None,
        }


async def add_rules(session: AsyncSession, tenant_id: uuid.UUID, rules: Iterable[Rule]) -> None:
    """Insert rules (an existing identical line is left alone). The caller recompiles."""
    rows = [rule.row(tenant_id) for rule in rules]
    if rows:
        await session.execute(insert(CasbinRule).values(rows).on_conflict_do_nothing())


async def remove_rule(session: AsyncSession, tenant_id: uuid.UUID, rule: Rule) -> None:
    """Delete the rule's line (all of it, v3 included). The caller recompiles."""
    row = rule.row(tenant_id)
    same_line = [
        getattr(CasbinRule, column) == row[column]
        for column in ("tenant_id", "ptype", "v0", "v1", "v2")
    ]
    v3 = CasbinRule.v3.is_(None) if row["v3"] is None else CasbinRule.v3 == row["v3"]
    await session.execute(delete(CasbinRule).where(*same_line, v3))


def personal_space_rules(kind: str, principal_id: uuid.UUID, space_id: uuid.UUID) -> list[Rule]:
    """The seed of every principal: read, write and delete in its own personal space."""
    who, where = principal_name(kind, principal_id), space_name(space_id)
    return [Rule("p", who, where, action) for action in ACTIONS]


_LONGEST_CHAIN = text(
    """
    WITH RECURSIVE walk(head, depth) AS (
        SELECT v1, 1 FROM casbin_rule WHERE tenant_id = :tenant AND ptype = :ptype
      UNION
        SELECT r.v1, w.depth + 1
          FROM walk w
          JOIN casbin_rule r ON r.tenant_id = :tenant AND r.ptype = :ptype AND r.v0 = w.head
         WHERE w.depth <= :limit
    )
    SELECT coalesce(max(depth), 0) FROM walk
    """
)


async def longest_chain(session: AsyncSession, tenant_id: uuid.UUID, ptype: Ptype) -> int:
    """Links in the tenant's longest `g` or `g2` chain (a cycle counts as longer than any
    limit)."""
    params = {"tenant": tenant_id, "ptype": ptype, "limit": MAX_CHAIN}
    return int((await session.execute(_LONGEST_CHAIN, params)).scalar_one())
