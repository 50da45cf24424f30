"""Who holds role:auditor and role:policy_admin, as the guards read it (the compiled closure,
`holds_role`), is pycasbin's role manager, exactly: random policies where principals, teams and
roles link to each other and to the two roles (chains up to 8 links), written one rule at a
time with the policy API's scoped rebuild, then some rules removed again."""

from __future__ import annotations

import asyncio
import uuid

import casbin
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.db.session import create_engine, create_sessionmaker
from service.db.tenancy import name_tenant
from service.policy.compile import apply_changes
from service.policy.powers import holds_role
from service.policy.rules import AUDITOR, POLICY_ADMIN, Rule, add_rules, remove_rule
from tests.integration.policy.test_compile_matches_casbin import KINDS, MODEL, TenantPolicy, _seed

ROLES = (AUDITOR, POLICY_ADMIN)
Holder = tuple[uuid.UUID, uuid.UUID, str]
"""(tenant, principal, role)."""


@st.composite
def role_policies(draw: st.DrawFn) -> tuple[TenantPolicy, list[Rule]]:
    """A tenant whose groups end in the two roles (links only point to later groups, so no
    cycles), and the rules removed again afterwards."""
    principals = [
        (draw(st.sampled_from(KINDS)), uuid.uuid4()) for _ in range(draw(st.integers(1, 4)))
    ]
    policy = TenantPolicy(uuid.uuid4(), principals, [])
    groups = [f"team:{uuid.uuid4()}" for _ in range(draw(st.integers(0, 4)))]
    groups += ["role:r0", *ROLES]
    for subject in policy.subjects():
        for group in draw(st.lists(st.sampled_from(groups), max_size=2)):
            policy.rules.append(Rule("g", subject, group))
    for i, group in enumerate(groups[:-1]):
        for parent in draw(st.lists(st.sampled_from(groups[i + 1 :]), max_size=2)):
            policy.rules.append(Rule("g", group, parent))
    policy.rules = draw(st.permutations(sorted(set(policy.rules), key=str)))
    removed = draw(st.lists(st.sampled_from(policy.rules), unique=True)) if policy.rules else []
    return policy, removed


def casbin_holders(policies: list[TenantPolicy]) -> set[Holder]:
    enforcer = casbin.Enforcer(str(MODEL))
    for policy in policies:
        domain = str(policy.tenant_id)
        for rule in policy.rules:
            enforcer.add_named_grouping_policy("g", rule.subject, rule.target, domain)
    manager = enforcer.get_role_manager()
    return {
        (policy.tenant_id, principal_id, role)
        for policy in policies
        for (_kind, principal_id), subject in zip(policy.principals, policy.subjects(), strict=True)
        for role in ROLES
        if manager.has_link(subject, role, str(policy.tenant_id))
    }


async def compiled_holders(url: str, scripts: list[tuple[TenantPolicy, list[Rule]]]) -> set[Holder]:
    engine = create_engine(url, pool_size=1, role="memgate_app")
    try:
        async with create_sessionmaker(engine).begin() as session:
            for policy, removed in scripts:
                await _seed(session, policy)
                for rule in policy.rules:
                    await add_rules(session, policy.tenant_id, [rule])
                    await apply_changes(session, policy.tenant_id, [rule])
                for rule in removed:
                    await remove_rule(session, policy.tenant_id, rule)
                    await apply_changes(session, policy.tenant_id, [rule])
            found: set[Holder] = set()
            for policy, _ in scripts:
                await name_tenant(session, policy.tenant_id)
                for _kind, principal_id in policy.principals:
                    for role in ROLES:
                        if await holds_role(session, policy.tenant_id, principal_id, role):
                            found.add((policy.tenant_id, principal_id, role))
            return found
    finally:
        await engine.dispose()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scripts=st.lists(role_policies(), min_size=2, max_size=2))
def test_the_role_guards_answer_what_casbin_answers(
    database_url: str, scripts: list[tuple[TenantPolicy, list[Rule]]]
) -> None:
    compiled = asyncio.run(compiled_holders(database_url, scripts))
    for policy, removed in scripts:
        policy.rules = [rule for rule in policy.rules if rule not in removed]
    expected = casbin_holders([policy for policy, _ in scripts])
    assert compiled == expected, {
        "only compiled": compiled - expected,
        "only casbin": expected - compiled,
    }
