"""The compiled grants are pycasbin's `enforce()`, exactly: random policies over three tenants
(membership chains up to 8 links, sub-space trees, grants to principals, teams and roles) are
written to `casbin_rule` one rule at a time, each followed by the scoped rebuild the policy API
runs (`apply_changes`), and every (principal, action, space) of every tenant is compared with
what pycasbin answers for the same lines and policies/memgate_model.conf. A full compile of
the same rules must give the same grants."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import casbin
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.session import create_engine, create_sessionmaker
from service.db.tenancy import name_tenant
from service.policy.compile import apply_changes, lock_policy, recompile
from service.policy.rules import (
    ACTIONS,
    Rule,
    add_rules,
    principal_name,
    remove_rule,
    space_name,
)

MODEL = Path(__file__).parents[3] / "policies" / "memgate_model.conf"
KINDS = ("user", "agent", "service")


@dataclass
class TenantPolicy:
    tenant_id: uuid.UUID
    principals: list[tuple[str, uuid.UUID]]
    spaces: list[uuid.UUID]
    rules: list[Rule] = field(default_factory=list)

    def subjects(self) -> list[str]:
        return [principal_name(kind, pid) for kind, pid in self.principals]


@st.composite
def tenant_policies(draw: st.DrawFn) -> TenantPolicy:
    principals = [
        (draw(st.sampled_from(KINDS)), uuid.uuid4()) for _ in range(draw(st.integers(1, 4)))
    ]
    spaces = [uuid.uuid4() for _ in range(draw(st.integers(1, 6)))]
    policy = TenantPolicy(uuid.uuid4(), principals, spaces)
    # Groups in a fixed order; a link only points to a later group, so there are no cycles and
    # the longest chain (principal → g0 → … → g7) has at most 8 links.
    groups = [f"team:{uuid.uuid4()}" for _ in range(draw(st.integers(0, 4)))]
    groups += [f"role:r{n}" for n in range(draw(st.integers(0, 4)))]
    for subject in policy.subjects():
        for group in draw(st.lists(st.sampled_from(groups), max_size=2)) if groups else []:
            policy.rules.append(Rule("g", subject, group))
    for i, group in enumerate(groups[:-1]):
        for parent in draw(st.lists(st.sampled_from(groups[i + 1 :]), max_size=2)):
            policy.rules.append(Rule("g", group, parent))
    # Sub-spaces: a tree (each space has at most one parent, an earlier space).
    for i in range(1, len(spaces)):
        if draw(st.booleans()):
            parent_id = spaces[draw(st.integers(0, i - 1))]
            policy.rules.append(Rule("g2", space_name(spaces[i]), space_name(parent_id)))
    grantees = policy.subjects() + groups
    for _ in range(draw(st.integers(0, 8))):
        policy.rules.append(
            Rule(
                "p",
                draw(st.sampled_from(grantees)),
                space_name(draw(st.sampled_from(spaces))),
                draw(st.sampled_from(ACTIONS)),
            )
        )
    # Any order: a grant may come before the membership or sub-space it reaches through.
    policy.rules = draw(st.permutations(policy.rules))
    return policy


def casbin_grants(policies: list[TenantPolicy]) -> set[tuple[uuid.UUID, uuid.UUID, str, uuid.UUID]]:
    enforcer = casbin.Enforcer(str(MODEL))
    for policy in policies:
        domain = str(policy.tenant_id)
        for rule in policy.rules:
            if rule.ptype == "p":
                enforcer.add_policy(rule.subject, domain, rule.target, rule.action)
            else:
                enforcer.add_named_grouping_policy(rule.ptype, rule.subject, rule.target, domain)
    allowed = set()
    for policy in policies:
        domain = str(policy.tenant_id)
        for kind, principal_id in policy.principals:
            for space_id in policy.spaces:
                for action in ACTIONS:
                    subject = principal_name(kind, principal_id)
                    if enforcer.enforce(subject, domain, space_name(space_id), action):
                        allowed.add((policy.tenant_id, principal_id, action, space_id))
    return allowed


async def _seed(session: AsyncSession, policy: TenantPolicy) -> None:
    """The tenant, its principals and spaces, and a compile with no rules yet (each principal's
    own name), the way the service creates them."""
    tenant = policy.tenant_id
    await name_tenant(session, tenant)  # row-level security: work in one tenant at a time
    await session.execute(
        text("INSERT INTO tenants (tenant_id, name) VALUES (:t, 'prop')"), {"t": tenant}
    )
    for kind, principal_id in policy.principals:
        await session.execute(
            text(
                "INSERT INTO principals (tenant_id, id, kind, display_name) "
                "VALUES (:t, :id, :kind, 'p')"
            ),
            {"t": tenant, "id": principal_id, "kind": kind},
        )
    for space_id in policy.spaces:
        await session.execute(
            text("INSERT INTO spaces (tenant_id, id, kind, name) VALUES (:t, :id, 'team', 's')"),
            {"t": tenant, "id": space_id},
        )
    await lock_policy(session, tenant)
    await recompile(session, tenant)


async def compiled_grants(
    url: str, policies: list[TenantPolicy]
) -> set[tuple[uuid.UUID, uuid.UUID, str, uuid.UUID]]:
    engine = create_engine(url, pool_size=1, role="memgate_app")
    try:
        async with create_sessionmaker(engine).begin() as session:
            for policy in policies:
                await _seed(session, policy)
                for rule in policy.rules:
                    await add_rules(session, policy.tenant_id, [rule])
                    await apply_changes(session, policy.tenant_id, [rule])
            tenants = [policy.tenant_id for policy in policies]
            incremental = await _space_grants(session, tenants)
            for tenant in tenants:
                await name_tenant(session, tenant)
                await recompile(session, tenant)
            assert await _space_grants(session, tenants) == incremental, "scoped != full"
            return incremental
    finally:
        await engine.dispose()


async def _space_grants(
    session: AsyncSession, tenants: list[uuid.UUID]
) -> set[tuple[uuid.UUID, uuid.UUID, str, uuid.UUID]]:
    """Each tenant's grants, read with that tenant named (row-level security shows no other)."""
    found: set[tuple[uuid.UUID, uuid.UUID, str, uuid.UUID]] = set()
    for tenant in tenants:
        await name_tenant(session, tenant)
        rows = await session.execute(
            text("SELECT tenant_id, principal_id, action, space_id FROM space_grants")
        )
        found |= {(t, p, a, s) for t, p, a, s in rows.all()}
    return found


EXAMPLES = 150


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(policies=st.lists(tenant_policies(), min_size=3, max_size=3))
def test_compiled_grants_equal_casbin_enforce(
    database_url: str, policies: list[TenantPolicy]
) -> None:
    expected = casbin_grants(policies)
    target(float(len(expected)))  # steer towards policies that grant a lot
    compiled = asyncio.run(compiled_grants(database_url, policies))
    assert compiled == expected, {
        "only compiled": compiled - expected,
        "only casbin": expected - compiled,
    }


Step = tuple[int, bool, int]
"""(tenant index, add or remove, rule index): one change through the policy API."""


@st.composite
def change_scripts(draw: st.DrawFn) -> tuple[list[TenantPolicy], list[Step]]:
    policies = draw(st.lists(tenant_policies(), min_size=2, max_size=2))
    steps = [
        (t, draw(st.booleans()), draw(st.integers(0, len(policies[t].rules) - 1)))
        for t in draw(st.lists(st.integers(0, 1), max_size=25))
        if policies[t].rules
    ]
    return policies, steps


async def _run_script(
    url: str, policies: list[TenantPolicy], steps: list[Step]
) -> tuple[set[tuple[uuid.UUID, uuid.UUID, str, uuid.UUID]], list[list[Rule]]]:
    """Every rule added, then the steps, each followed by its scoped rebuild (a removed rule is
    deleted first, as the API does); answers the grants and the rules left per tenant."""
    engine = create_engine(url, pool_size=1, role="memgate_app")
    left: list[set[Rule]] = [set(policy.rules) for policy in policies]
    try:
        async with create_sessionmaker(engine).begin() as session:
            for policy in policies:
                await _seed(session, policy)
                for rule in policy.rules:
                    await add_rules(session, policy.tenant_id, [rule])
                    await apply_changes(session, policy.tenant_id, [rule])
            for t, add, index in steps:
                tenant, rule = policies[t].tenant_id, policies[t].rules[index]
                await name_tenant(session, tenant)
                if add:
                    await add_rules(session, tenant, [rule])
                    left[t].add(rule)
                else:
                    await remove_rule(session, tenant, rule)
                    left[t].discard(rule)
                await apply_changes(session, tenant, [rule])
            tenants = [policy.tenant_id for policy in policies]
            incremental = await _space_grants(session, tenants)
            for tenant in tenants:
                await name_tenant(session, tenant)
                await recompile(session, tenant)
            assert await _space_grants(session, tenants) == incremental, "scoped != full"
    finally:
        await engine.dispose()
    kept = zip(policies, left, strict=True)
    return incremental, [[rule for rule in p.rules if rule in rules] for p, rules in kept]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=change_scripts())
def test_adding_and_removing_rules_one_by_one_equals_casbin(
    database_url: str, script: tuple[list[TenantPolicy], list[Step]]
) -> None:
    """Red-team: the first property test only added rules. Here rules are also removed, in any
    order, each change rebuilt as the API rebuilds it."""
    policies, steps = script
    compiled, rules_left = asyncio.run(_run_script(database_url, policies, steps))
    for policy, rules in zip(policies, rules_left, strict=True):
        policy.rules = rules
    assert compiled == casbin_grants(policies)
