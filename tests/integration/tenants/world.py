"""Two tenants seeded alike through the public API, each with every kind of thing a caller can
name (memories, principals, clients, spaces, teams, a delegation, audit rows) and names and
canaries that exist in that tenant only. The cross-tenant probes name one side's things with
the other side's tokens; `World.swapped()` turns the roles round for the token probes."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from service.audit.checkpoints import run_checkpoints
from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from tests.conftest import TRUSTED_TEST_ISSUER
from tests.fixtures.api import MEMORY_SCOPES, Agent, Api

TRUSTED_ISSUER = TRUSTED_TEST_ISSUER
"""The external issuer the test deployment trusts (principals may be mapped to it)."""


@dataclass(frozen=True)
class Side:
    """One tenant's seeded things. `names` and `canaries` exist in this tenant only."""

    api: Api
    agent: Agent
    """An agent principal with the memory scopes (and no admin scope)."""
    user: Agent
    """A user principal that allowed `agent` to act for it (token exchange)."""
    memory: dict[str, Any]
    space: dict[str, Any]
    team: dict[str, Any]
    principal: dict[str, Any]
    """A principal with no client, named `names["principal"]`."""
    tag: str
    stranger: Agent
    """A user of this tenant who allowed nobody to act for it."""
    pseudonym: str
    """The agent's actor pseudonym in this tenant's audit chain."""
    first_hash: str
    """The row hash of seq 1 of this tenant's audit chain."""
    delegated: str
    """A token of `agent` acting for `user` (RFC 8693 token exchange)."""
    issuer: dict[str, Any]
    """The tenant's registered external IdP (never fetched: registration does not)."""
    run: dict[str, Any]
    """A queued dry run of `memory.sweep_expired` in this tenant (nobody runs it)."""
    erasure: dict[str, Any]
    """A planned erasure (never executed), by the admin, who holds the eraser role."""

    @property
    def tenant_id(self) -> str:
        return self.api.tenant_id

    @property
    def admin(self) -> Agent:
        return self.api.admin

    @property
    def names(self) -> dict[str, str]:
        """Names a caller can type that exist in this tenant only (equal lengths per side, so
        that a name of one side and a made-up one of the same length compare byte for byte)."""
        return {
            "team": f"team-{self.tag}",
            "space": f"space-{self.tag}",
            "principal": f"person-{self.tag}",
            "subject": f"service:only-{self.tag}",
            "key": f"key.only.{self.tag}",
            "external": f"extern-{self.tag}",
        }

    @property
    def canaries(self) -> tuple[str, ...]:
        """What must never reach the other tenant: its id, its content, its names."""
        return (self.tenant_id, f"canary-{self.tag}-content", *self.names.values())

    @property
    def ids(self) -> tuple[str, ...]:
        return (
            self.tenant_id,
            self.memory["id"],
            self.space["id"],
            self.team["id"],
            self.principal["id"],
            self.agent.principal_id,
            self.agent.client_id,
            self.user.principal_id,
            self.user.client_id,
            self.admin.principal_id,
            self.admin.client_id,
        )


@dataclass(frozen=True)
class World:
    home: Side
    """The caller's tenant."""
    away: Side
    """The other tenant, whose things the caller names."""

    def swapped(self) -> World:
        return replace(self, home=self.away, away=self.home)

    def delegated(self) -> World:
        """Roles turned round, and the other tenant's agent calls with its delegated token."""
        caller = self.away
        acting = replace(caller, agent=replace(caller.agent, token=caller.delegated))
        return replace(self, home=acting, away=self.home)


async def _ok(api: Api, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
    response = await api.http.request(method, path, headers=api.admin.headers, **kwargs)
    assert response.status_code == status, response.text
    return response.json() if response.content else None


async def seed_side(api: Api, tag: str) -> Side:
    """Everything of one tenant, made the way an operator would make it."""
    names = {
        "team": f"team-{tag}",
        "space": f"space-{tag}",
        "principal": f"person-{tag}",
    }
    agent_principal = await api.new_principal(f"agent-{tag}", kind="agent")
    # review:memory too: the review tools and routes then answer past the scope (an agent
    # never reviews, so they answer as for any id it cannot see or decide on).
    created = await api.new_client(agent_principal["id"], (*MEMORY_SCOPES, "review:memory"))
    client_id, secret = created["client"]["client_id"], created["client_secret"]
    agent = Agent(
        agent_principal["id"],
        client_id,
        secret,
        await api.access_token(client_id, secret),
        MEMORY_SCOPES,
    )
    user = await api.new_agent(
        f"user-{tag}", scopes=(*MEMORY_SCOPES, "review:memory", "manage:delegates")
    )
    team = await _ok(api, "POST", "/v1/teams", 201, json={"name": names["team"]})
    space = (await _ok(api, "POST", "/v1/spaces", 201, json={"name": names["space"]}))["space"]
    for action in ("read", "write"):
        await _ok(api, "PUT", f"/v1/spaces/{space['id']}/grants/{action}/{team['subject']}")
    await _ok(api, "PUT", f"/v1/teams/{team['id']}/members/{agent.principal_id}")
    await _ok(api, "PUT", f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", 204)
    principal = await api.new_principal(names["principal"])
    await api.new_principal(
        "mapped", external_issuer=TRUSTED_ISSUER, external_subject=f"extern-{tag}"
    )
    stranger = await api.new_agent(f"stranger-{tag}")
    memory = await api.remember(
        agent,
        subject=f"service:only-{tag}",
        key=f"key.only.{tag}",
        value=f"the canary-{tag}-content of this tenant",
        space_id=space["id"],
    )
    await api.remember(agent, key=f"private.{tag}", value=f"canary-{tag}-content, privately")
    await api.http.get(f"/v1/memories/{memory['id']}", headers=agent.headers)
    events = await _ok(api, "GET", "/v1/audit/events", params={"action": "memory.get"})
    exported = await api.http.get(
        "/v1/audit/export", params={"limit": 1}, headers=api.admin.headers
    )
    first = json.loads(exported.text.splitlines()[0])
    exchanged = await api.http.post(
        "/oauth/token",
        data={
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": user.token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
        },
        auth=(agent.client_id, agent.secret),
    )
    assert exchanged.status_code == 200, exchanged.text
    issuer = await _ok(
        api,
        "POST",
        "/v1/issuers",
        201,
        json={
            "issuer": f"https://idp-{tag}.example",
            "audience": f"memgate-{tag}",
            "jwks_url": f"https://idp-{tag}.example/jwks",
        },
    )
    run = await _ok(
        api,
        "POST",
        "/v1/jobs/memory.sweep_expired/runs",
        202,
        json={"dry_run": True, "space_id": space["id"]},
    )
    await _ok(api, "PUT", f"/v1/principals/{api.admin.principal_id}/roles/eraser")
    erasure = await _ok(
        api,
        "POST",
        "/v1/erasures",
        201,
        json={"subjects": [f"service:only-{tag}"], "reason": "the probe's plan"},
    )
    return Side(
        api,
        agent,
        user,
        memory,
        space,
        team,
        principal,
        tag,
        stranger,
        pseudonym=events["items"][0]["actor"],
        first_hash=first["row_hash"],
        delegated=exchanged.json()["access_token"],
        issuer=issuer,
        run=run,
        erasure=erasure,
    )


async def seed_world(api: Api) -> World:
    # Tags of equal length: a name of one tenant and its made-up twin have the same length.
    home = await seed_side(api, "acme01")
    away = await seed_side(await api.other_tenant(), "glbx02")
    # A signed checkpoint in each chain, so that the checkpoint route answers with one.
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    return World(home, away)
