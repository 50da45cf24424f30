"""The cross-tenant probe table: for every route of the app, what a caller of one tenant can
name there (ids in the path, ids in query filters and bodies, names) and the other tenant's
value to put in that place. Each probe also says what the made-up twin of that value answers
(a problem slug or a success status), so a malformed probe cannot pass by being refused for
some other reason. `test_cross_tenant_matrix.py` runs them; a route of the app without a row
here (or a reason in NAMES_NOTHING) fails `test_every_route_has_cross_tenant_probes`.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from service.memory.service import decode_cursor, encode_cursor
from tests.fixtures.api import Agent
from tests.integration.tenants.world import TRUSTED_ISSUER, Side

ID, FILTER, BODY, NAME, LISTING = "path-id", "filter-id", "body-id", "name", "listing"
"""Kinds of probe: another tenant's id in the path / in a query filter / in a body, a name that
exists only in another tenant, and a route that names nothing (its answer must carry nothing of
the other tenant). Every path-id probe also runs the other way round: the other tenant's token
against the caller's ids (kind "token")."""


@dataclass(frozen=True)
class Ask:
    """One HTTP request (the bearer token is the probe's caller's unless `form` authenticates
    a client itself)."""

    method: str
    path: str
    params: dict[str, str] | None = None
    json: Any = None
    form: dict[str, str] | None = None
    basic: tuple[str, str] | None = None


Value = Callable[[Side], str]
"""What a probe names, taken from one side of the world."""


@dataclass(frozen=True)
class Probe:
    route: str
    """`METHOD /template` as the app lists it, path parameters written `{id}`."""
    kind: str
    slot: str
    """What the value stands for, e.g. `memory` or `space_id filter`."""
    ask: Callable[[Side, str], Ask]
    """The request of a caller on `Side`, with the value in the probed place."""
    value: Value
    """The value of the other side (its memory id, its team name ...)."""
    expect: int | str
    """What the made-up twin answers: a problem slug, or a success status."""
    caller: Callable[[Side], Agent | None] = field(default=lambda side: side.admin)
    twin: Callable[[Side, str], str] = field(default=lambda side, value: str(uuid.uuid4()))
    """A value of the same shape and length that exists nowhere (given the caller's side)."""
    creates: bool = False
    """The call succeeds and makes something: ids and times it generates are normalized."""
    platform_audit: bool = False
    """The call is audited in the platform chain (a refused token request belongs to no
    tenant), not in the caller's."""
    volatile: tuple[str, ...] = ()
    """JSON members that change between any two calls (the caller's own chain grows by one row
    per call): their values are normalized."""

    @property
    def id(self) -> str:
        return f"{self.route} [{self.kind}: {self.slot}]"


def same_length_name(side: Side, value: str) -> str:
    """A made-up name of the same length and alphabet (lowercase hex after the first dash)."""
    head, _, tail = value.partition("-")
    made_up = secrets.token_hex(len(tail))[: len(tail)]
    return f"{head}-{made_up}" if tail else secrets.token_hex(len(value))[: len(value)]


def made_up_subject(side: Side, value: str) -> str:
    """`service:only-xxxxxx` → the same prefix, a made-up tail."""
    prefix, _, tail = value.rpartition("-")
    return f"{prefix}-{secrets.token_hex(len(tail))[: len(tail)]}"


def made_up_key(side: Side, value: str) -> str:
    prefix, _, tail = value.rpartition(".")
    return f"{prefix}.{secrets.token_hex(len(tail))[: len(tail)]}"


def foreign_cursor(side: Side) -> str:
    """A list cursor the other tenant was handed: it carries one of its memory ids."""
    return encode_cursor(uuid.UUID(side.memory["id"]))


def made_up_cursor(side: Side, value: str) -> str:
    """A cursor at the same instant (the ids are UUIDv7, so the first 48 bits are the time) for
    an id that exists nowhere: the same position, for the caller's keyset."""
    after = decode_cursor(value)
    tail = uuid.uuid4().int & ((1 << 80) - 1)
    return encode_cursor(uuid.UUID(int=(after.int >> 80 << 80) | tail))


def made_up_hash(_: Side, __: str) -> str:
    return secrets.token_hex(32)


def _agent(side: Side) -> Agent:
    return side.agent


def _anonymous(_: Side) -> None:
    return None


def _get(path: str, **params: str) -> Callable[[Side, str], Ask]:
    return lambda side, value: Ask("GET", path.format(value=value), params or None)


def _path(method: str, template: str) -> Callable[[Side, str], Ask]:
    """`template` with `{value}` for the probed id and `{own.X}` for the caller's own ids."""

    def ask(side: Side, value: str) -> Ask:
        own = {
            "memory": side.memory["id"],
            "space": side.space["id"],
            "team": side.team["id"],
            "principal": side.principal["id"],
            "agent": side.agent.principal_id,
            "user": side.user.principal_id,
            "client": side.agent.client_id,
            "tenant": side.tenant_id,
        }
        path = template.replace("{value}", value)
        for name, own_id in own.items():
            path = path.replace("{own." + name + "}", own_id)
        return Ask(method, path)

    return ask


def _filtered(path: str, name: str) -> Callable[[Side, str], Ask]:
    return lambda side, value: Ask("GET", path, {name: value})


def _memory_body(**extra: Any) -> Callable[[Side, str], Ask]:
    def ask(side: Side, value: str) -> Ask:
        body: dict[str, Any] = {
            "subject": "service:probe",
            "kind": "fact",
            "key": "probe",
            "value": "probe",
        }
        # "{value}" marks the probed field; derived_from takes it as its one list item.
        body |= {name: (value if spec == "{value}" else spec) for name, spec in extra.items()}
        if "derived_from" in extra:
            body["derived_from"] = [value]
        return Ask("POST", "/v1/memories", json=body)

    return ask


def _batch_body(**extra: Any) -> Callable[[Side, str], Ask]:
    """A batch of one write whose probed field holds the value (a foreign id in any item is
    that item's 404, so the batch's 422 `batch-rejected` lists it as the single write's)."""
    single = _memory_body(**extra)

    def ask(side: Side, value: str) -> Ask:
        return Ask("POST", "/v1/memories:batch", json={"items": [single(side, value).json]})

    return ask


def _search(filter_name: str) -> Callable[[Side, str], Ask]:
    """A search whose `filters.<filter_name>` is the probed value."""
    return lambda side, value: Ask(
        "POST",
        "/v1/memories/search",
        json={"query": "probe", "k": 5, "filters": {filter_name: value}},
    )


def memory_id_of(side: Side) -> str:
    return str(side.memory["id"])


def space_id_of(side: Side) -> str:
    return str(side.space["id"])


def _team_id(side: Side) -> str:
    return str(side.team["id"])


def _principal_id(side: Side) -> str:
    return str(side.principal["id"])


def _agent_id(side: Side) -> str:
    return side.agent.principal_id


def _user_id(side: Side) -> str:
    return side.user.principal_id


def _client_id(side: Side) -> str:
    return side.agent.client_id


def _admin_client_id(side: Side) -> str:
    return side.admin.client_id


def _issuer_id(side: Side) -> str:
    return str(side.issuer["id"])


def _run_id(side: Side) -> str:
    return str(side.run["id"])


def _erasure_id(side: Side) -> str:
    return str(side.erasure["id"])


ERASURE = "/v1/erasures/{id}"
NOT_ERASURE = "erasure-not-found"


def _tenant_id(side: Side) -> str:
    return side.tenant_id


TENANT = "/v1/tenants/{id}"
PLATFORM_ONLY = "platform-admin-required"
"""What a tenant admin gets on every platform route, before any lookup (test_access.py)."""


def name_of(kind: str) -> Value:
    return lambda side: side.names[kind]


def _exchange(side: Side, subject_token: str) -> Ask:
    return Ask(
        "POST",
        "/oauth/token",
        form={
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
        },
        basic=(side.agent.client_id, side.agent.secret),
    )


def _exchange_with_actor(side: Side, actor_token: str) -> Ask:
    """The caller's own user's token as subject, another token as `actor_token` (refused
    whatever it is: the acting agent is the authenticated client)."""
    ask = _exchange(side, side.user.token)
    assert ask.form is not None
    return Ask(ask.method, ask.path, form={**ask.form, "actor_token": actor_token}, basic=ask.basic)


def _id(route: str, template: str, slot: str, value: Value, expect: str, **kw: Any) -> Probe:
    """A path-id probe: `template` has `{value}` where the other tenant's id goes and
    `{own.X}` where the caller's own things go."""
    method = route.split(maxsplit=1)[0]
    return Probe(route, ID, slot, _path(method, template), value, expect, **kw)


def _body(
    route: str,
    slot: str,
    body: Callable[[Side, str], Any],
    value: Value,
    expect: int | str,
    kind: str = BODY,
    **kw: Any,
) -> Probe:
    method, path = route.split()
    return Probe(
        route,
        kind,
        slot,
        lambda side, v: Ask(method, path, json=body(side, v)),
        value,
        expect,
        **kw,
    )


def _listing(
    route: str,
    slot: str = "nothing named",
    params: dict[str, str] | None = None,
    json: Any = None,
    **kw: Any,
) -> Probe:
    """A route asked without naming anything of the other tenant's: its answer (and the
    caller's audit row and the logs) must carry nothing of it."""
    method, path = route.split()
    ask = Ask(method, path, params, json)
    return Probe(route, LISTING, slot, lambda side, v: ask, memory_id_of, 200, **kw)


MEMORY = "/v1/memories/{id}"
PRINCIPAL = "/v1/principals/{id}"
CLIENT = "/v1/clients/{id}"
MEMBERS = "/v1/teams/{id}/members/{id}"
GRANTS = "/v1/spaces/{id}/grants/{id}/{id}"
ROLE_MEMBERS = "/v1/roles/{id}/members/{id}"
DELEGATES = "/v1/principals/{id}/delegates/{id}"
ROLES = "/v1/principals/{id}/roles/{id}"

PROBES: tuple[Probe, ...] = (
    # memories ---------------------------------------------------------------------------
    _id(
        f"GET {MEMORY}",
        "/v1/memories/{value}",
        "memory",
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    _id(
        f"DELETE {MEMORY}",
        "/v1/memories/{value}",
        "memory",
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    _id(
        f"GET {MEMORY}/history",
        "/v1/memories/{value}/history",
        "memory",
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    _id(
        f"POST {MEMORY}/revert",
        "/v1/memories/{value}/revert",
        "memory",
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    # review (issue 15): the admin holds review:memory, not the other tenant's grants
    _id(
        f"POST {MEMORY}/approve",
        "/v1/memories/{value}/approve",
        "memory",
        memory_id_of,
        "memory-not-found",
    ),
    Probe(
        f"POST {MEMORY}/reject",
        ID,
        "memory",
        lambda side, value: Ask("POST", f"/v1/memories/{value}/reject", json={"reason": "no"}),
        memory_id_of,
        "memory-not-found",
    ),
    _id(
        "GET /v1/spaces/{id}/proposals",
        "/v1/spaces/{value}/proposals",
        "space",
        space_id_of,
        "space-not-found",
    ),
    Probe(
        f"POST {MEMORY}/revoke",
        ID,
        "memory",
        lambda side, v: Ask("POST", f"/v1/memories/{v}/revoke", json={"reason": "probe"}),
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    Probe(
        f"POST {MEMORY}/reinstate",
        ID,
        "memory",
        lambda side, v: Ask("POST", f"/v1/memories/{v}/reinstate", json={"reason": "probe"}),
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    Probe(
        "POST /v1/memories",
        BODY,
        "space_id",
        _memory_body(space_id="{value}"),
        space_id_of,
        "space-not-found",
        caller=_agent,
    ),
    Probe(
        "POST /v1/memories",
        BODY,
        "derived_from",
        _memory_body(derived_from="{value}"),
        memory_id_of,
        "memory-not-found",
        caller=_agent,
    ),
    Probe(
        "POST /v1/memories:batch",
        BODY,
        "items[].space_id",
        _batch_body(space_id="{value}"),
        space_id_of,
        "batch-rejected",
        caller=_agent,
    ),
    Probe(
        "POST /v1/memories:batch",
        BODY,
        "items[].derived_from",
        _batch_body(derived_from="{value}"),
        memory_id_of,
        "batch-rejected",
        caller=_agent,
    ),
    Probe(
        "GET /v1/memories",
        FILTER,
        "space_id filter",
        _filtered("/v1/memories", "space_id"),
        space_id_of,
        "space-not-found",
        caller=_agent,
    ),
    Probe(
        "GET /v1/memories",
        NAME,
        "subject filter",
        _filtered("/v1/memories", "subject"),
        name_of("subject"),
        200,
        caller=_agent,
        twin=made_up_subject,
    ),
    Probe(
        "GET /v1/memories",
        NAME,
        "key filter",
        _filtered("/v1/memories", "key"),
        name_of("key"),
        200,
        caller=_agent,
        twin=made_up_key,
    ),
    Probe(
        "GET /v1/memories",
        FILTER,
        "cursor (the other tenant's page position)",
        _filtered("/v1/memories", "cursor"),
        foreign_cursor,
        200,
        caller=_agent,
        twin=made_up_cursor,
    ),
    _listing("GET /v1/memories", caller=_agent),
    _listing(
        "GET /v1/memories/counts",
        "grouped by subject",
        {"group_by": "subject"},
        caller=_agent,
    ),
    _listing(
        "POST /v1/memories/search",
        "the other tenant's content as the query",
        # The other tenant is glbx02 in the world as seeded (listings are not run swapped).
        json={"query": "the canary-glbx02-content of this tenant", "k": 50},
        caller=_agent,
    ),
    _listing(
        "POST /v1/memories/search",
        "the other tenant's content as a lexical query, floor off",
        # The lexical leg's postings are read under Visible too: nothing of the other tenant.
        json={
            "query": "the canary-glbx02-content of this tenant",
            "k": 50,
            "mode": "lexical",
            "min_score": 0,
        },
        caller=_agent,
    ),
    _listing(
        "POST /v1/memories/search",
        "the other tenant's content as a hybrid query, floor off",
        json={"query": "the canary-glbx02-content of this tenant", "k": 50, "min_score": 0},
        caller=_agent,
    ),
    Probe(
        "GET /v1/memories/counts",
        FILTER,
        "space_id filter",
        _filtered("/v1/memories/counts", "space_id"),
        space_id_of,
        "space-not-found",
        caller=_agent,
    ),
    Probe(
        "GET /v1/memories/counts",
        NAME,
        "subject filter",
        _filtered("/v1/memories/counts", "subject"),
        name_of("subject"),
        200,
        caller=_agent,
        twin=made_up_subject,
    ),
    Probe(
        "GET /v1/memories/counts",
        NAME,
        "key filter",
        _filtered("/v1/memories/counts", "key"),
        name_of("key"),
        200,
        caller=_agent,
        twin=made_up_key,
    ),
    Probe(
        "POST /v1/memories/search",
        FILTER,
        "space_id filter",
        _search("space_id"),
        space_id_of,
        "space-not-found",
        caller=_agent,
    ),
    Probe(
        "POST /v1/memories/search",
        NAME,
        "subject filter",
        _search("subject"),
        name_of("subject"),
        200,
        caller=_agent,
        twin=made_up_subject,
    ),
    Probe(
        "POST /v1/memories/search",
        NAME,
        "key filter",
        _search("key"),
        name_of("key"),
        200,
        caller=_agent,
        twin=made_up_key,
    ),
    # principals and clients ---------------------------------------------------------------
    _id(
        f"GET {PRINCIPAL}",
        "/v1/principals/{value}",
        "principal",
        _principal_id,
        "principal-not-found",
    ),
    _id(
        f"GET {PRINCIPAL}",
        "/v1/principals/{value}",
        "agent principal",
        _agent_id,
        "principal-not-found",
    ),
    _id(f"GET {CLIENT}", "/v1/clients/{value}", "client", _client_id, "client-not-found"),
    _id(
        f"GET {CLIENT}", "/v1/clients/{value}", "admin client", _admin_client_id, "client-not-found"
    ),
    _id(
        f"POST {CLIENT}/disable",
        "/v1/clients/{value}/disable",
        "client",
        _client_id,
        "client-not-found",
    ),
    _id(
        f"POST {CLIENT}/enable",
        "/v1/clients/{value}/enable",
        "client",
        _client_id,
        "client-not-found",
    ),
    _id(
        f"PUT {ROLES}",
        "/v1/principals/{value}/roles/auditor",
        "principal",
        _principal_id,
        "principal-not-found",
    ),
    _id(
        f"DELETE {ROLES}",
        "/v1/principals/{value}/roles/auditor",
        "principal",
        _principal_id,
        "principal-not-found",
    ),
    _body(
        "POST /v1/clients",
        "principal_id",
        lambda side, v: {"principal_id": v, "name": "probe", "scopes": ["read:memory"]},
        _principal_id,
        "principal-not-found",
    ),
    _listing("GET /v1/principals"),
    _listing("GET /v1/clients"),
    # external issuers -----------------------------------------------------------------------
    _id("GET /v1/issuers/{id}", "/v1/issuers/{value}", "issuer", _issuer_id, "issuer-not-found"),
    _id(
        "DELETE /v1/issuers/{id}",
        "/v1/issuers/{value}",
        "issuer",
        _issuer_id,
        "issuer-not-found",
    ),
    _listing("GET /v1/issuers"),
    # job runs -------------------------------------------------------------------------------
    _id("GET /v1/jobs/runs/{id}", "/v1/jobs/runs/{value}", "job run", _run_id, "job-run-not-found"),
    Probe(
        "POST /v1/jobs/{id}/runs",
        BODY,
        "space_id",
        lambda side, v: Ask(
            "POST", "/v1/jobs/memory.sweep_expired/runs", json={"space_id": v, "dry_run": True}
        ),
        space_id_of,
        "space-not-found",
    ),
    # The path names a job (one list for every tenant): another tenant's run id there is an
    # unknown job, like any made-up name.
    Probe(
        "POST /v1/jobs/{id}/runs",
        ID,
        "job name",
        lambda side, v: Ask("POST", f"/v1/jobs/{v}/runs", json={"dry_run": True}),
        _run_id,
        "unknown-job",
    ),
    _listing("GET /v1/jobs/runs"),
    # erasures -------------------------------------------------------------------------------
    _id(f"GET {ERASURE}", "/v1/erasures/{value}", "erasure", _erasure_id, NOT_ERASURE),
    _id(f"GET {ERASURE}/proof", "/v1/erasures/{value}/proof", "erasure", _erasure_id, NOT_ERASURE),
    _id(f"POST {ERASURE}/plan", "/v1/erasures/{value}/plan", "erasure", _erasure_id, NOT_ERASURE),
    Probe(
        f"POST {ERASURE}/execute",
        ID,
        "erasure",
        lambda side, v: Ask("POST", f"/v1/erasures/{v}/execute", json={"version": 1}),
        _erasure_id,
        NOT_ERASURE,
    ),
    _body(
        "POST /v1/erasures",
        "owner principal",
        lambda side, v: {"owners": [v], "reason": "probe"},
        _agent_id,
        "principal-not-found",
    ),
    _body(
        "POST /v1/erasures",
        "memory id",
        lambda side, v: {"memory_ids": [v], "reason": "probe"},
        memory_id_of,
        "memory-not-found",
    ),
    # platform routes: a tenant admin is refused before any lookup ----------------------------
    _id(f"GET {TENANT}", "/v1/tenants/{value}", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(f"PATCH {TENANT}", "/v1/tenants/{value}", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(f"DELETE {TENANT}", "/v1/tenants/{value}", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(
        f"POST {TENANT}/disable", "/v1/tenants/{value}/disable", "tenant", _tenant_id, PLATFORM_ONLY
    ),
    _id(f"POST {TENANT}/enable", "/v1/tenants/{value}/enable", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(f"GET {TENANT}/limits", "/v1/tenants/{value}/limits", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(f"GET {TENANT}/proof", "/v1/tenants/{value}/proof", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(f"PUT {TENANT}/limits", "/v1/tenants/{value}/limits", "tenant", _tenant_id, PLATFORM_ONLY),
    _id(
        f"PUT {TENANT}/clients/{{id}}/limits",
        "/v1/tenants/{own.tenant}/clients/{value}/limits",
        "client",
        _client_id,
        PLATFORM_ONLY,
    ),
    # teams, spaces, grants, roles, delegations ---------------------------------------------
    _id(
        f"PUT {MEMBERS}",
        "/v1/teams/{value}/members/{own.agent}",
        "team",
        _team_id,
        "team-not-found",
    ),
    _id(
        f"PUT {MEMBERS}",
        "/v1/teams/{own.team}/members/{value}",
        "member",
        _agent_id,
        "principal-not-found",
    ),
    _id(
        f"PUT {MEMBERS}",
        "/v1/teams/{own.team}/members/team:{value}",
        "member team",
        _team_id,
        "team-not-found",
    ),
    _id(
        f"DELETE {MEMBERS}",
        "/v1/teams/{value}/members/{own.agent}",
        "team",
        _team_id,
        "team-not-found",
    ),
    _id(
        f"DELETE {MEMBERS}",
        "/v1/teams/{own.team}/members/{value}",
        "member",
        _agent_id,
        "principal-not-found",
    ),
    _id(
        f"PUT {GRANTS}",
        "/v1/spaces/{value}/grants/read/team:{own.team}",
        "space",
        space_id_of,
        "space-unknown",
    ),
    _id(
        f"PUT {GRANTS}",
        "/v1/spaces/{own.space}/grants/read/team:{value}",
        "team subject",
        _team_id,
        "team-not-found",
    ),
    _id(
        f"PUT {GRANTS}",
        "/v1/spaces/{own.space}/grants/read/agent:{value}",
        "agent subject",
        _agent_id,
        "principal-not-found",
    ),
    _id(
        f"DELETE {GRANTS}",
        "/v1/spaces/{value}/grants/read/team:{own.team}",
        "space",
        space_id_of,
        "space-unknown",
    ),
    _id(
        f"DELETE {GRANTS}",
        "/v1/spaces/{own.space}/grants/read/user:{value}",
        "user subject",
        _user_id,
        "principal-not-found",
    ),
    Probe(
        "PUT /v1/spaces/{id}/settings",
        ID,
        "space",
        lambda side, value: Ask("PUT", f"/v1/spaces/{value}/settings", json={"write_gate": True}),
        space_id_of,
        "space-unknown",
    ),
    Probe(
        "PUT /v1/spaces/{id}/settings",
        BODY,
        "consolidation.with_spaces",
        lambda side, value: Ask(
            "PUT",
            f"/v1/spaces/{side.space['id']}/settings",
            json={"consolidation": {"with_spaces": [value]}},
        ),
        space_id_of,
        "space-unknown",
    ),
    _id(
        "GET /v1/spaces/{id}/access/{id}",
        "/v1/spaces/{value}/access/read",
        "space",
        space_id_of,
        "space-unknown",
    ),
    _id(
        "GET /v1/principals/{id}/permissions",
        "/v1/principals/{value}/permissions",
        "principal",
        _agent_id,
        "principal-not-found",
    ),
    _id(
        f"PUT {ROLE_MEMBERS}",
        "/v1/roles/policy_admin/members/{value}",
        "principal",
        _principal_id,
        "principal-not-found",
    ),
    _id(
        f"DELETE {ROLE_MEMBERS}",
        "/v1/roles/policy_admin/members/{value}",
        "principal",
        _principal_id,
        "principal-not-found",
    ),
    _id(
        f"PUT {DELEGATES}",
        "/v1/principals/{value}/delegates/{own.agent}",
        "user",
        _user_id,
        "principal-not-found",
    ),
    _id(
        f"PUT {DELEGATES}",
        "/v1/principals/{own.user}/delegates/{value}",
        "agent",
        _agent_id,
        "principal-not-found",
    ),
    _id(
        f"DELETE {DELEGATES}",
        "/v1/principals/{value}/delegates/{own.agent}",
        "user",
        _user_id,
        "principal-not-found",
    ),
    _id(
        f"DELETE {DELEGATES}",
        "/v1/principals/{own.user}/delegates/{value}",
        "agent",
        _agent_id,
        "principal-not-found",
    ),
    _body(
        "POST /v1/spaces",
        "parent_id",
        lambda side, v: {"name": "probe", "parent_id": v},
        space_id_of,
        "space-unknown",
    ),
    _listing("GET /v1/teams"),
    _listing("GET /v1/spaces"),
    # audit --------------------------------------------------------------------------------
    Probe(
        "GET /v1/audit/events",
        FILTER,
        "actor filter (principal id)",
        _filtered("/v1/audit/events", "actor"),
        _agent_id,
        200,
    ),
    Probe(
        "GET /v1/audit/events",
        FILTER,
        "target filter",
        _filtered("/v1/audit/events", "target"),
        lambda side: side.stranger.principal_id,
        200,
    ),
    Probe(
        "GET /v1/audit/events",
        FILTER,
        "actor filter (the other chain's pseudonym)",
        _filtered("/v1/audit/events", "actor"),
        lambda side: side.pseudonym,
        200,
        twin=made_up_hash,
    ),
    Probe(
        "GET /v1/audit/verify",
        FILTER,
        "known head of the other tenant's chain",
        lambda side, v: Ask("GET", "/v1/audit/verify", {"known_seq": "1", "known_hash": v}),
        lambda side: side.first_hash,
        200,
        twin=made_up_hash,
        volatile=("to_seq", "checked", "head_seq", "head_hash"),
    ),
    _listing("GET /v1/audit/events"),
    _listing("GET /v1/audit/export"),
    _listing("GET /v1/audit/checkpoints/latest"),
    _listing("GET /v1/audit/keys"),
    # the token endpoint -------------------------------------------------------------------
    Probe(
        "POST /oauth/token",
        BODY,
        "subject_token of the other tenant's user",
        _exchange,
        lambda side: side.user.token,
        "oauth-invalid-grant",
        caller=_anonymous,
        twin=lambda side, v: side.stranger.token,
        platform_audit=True,
    ),
    Probe(
        "POST /oauth/token",
        BODY,
        "actor_token of the other tenant's agent",
        _exchange_with_actor,
        lambda side: side.agent.token,
        "oauth-invalid-request",
        caller=_anonymous,
        twin=lambda side, v: side.stranger.token,
        platform_audit=True,
    ),
)

CREATING: tuple[Probe, ...] = (
    # An erasure's criteria reach the caller's tenant only: the other tenant's subject (or a
    # name its rows mention) plans an erasure of nothing, like a made-up one.
    _body(
        "POST /v1/erasures",
        "subject",
        lambda side, v: {"subjects": [v], "reason": "probe"},
        name_of("subject"),
        201,
        kind=NAME,
        twin=made_up_subject,
        creates=True,
    ),
    _body(
        "POST /v1/erasures",
        "name for the mention scan",
        lambda side, v: {"subjects": ["service:nobody"], "names": [v], "reason": "probe"},
        name_of("subject"),
        201,
        kind=NAME,
        twin=made_up_subject,
        creates=True,
    ),
    Probe(
        "POST /v1/memories",
        NAME,
        "subject (no supersession across tenants)",
        _memory_body(subject="{value}", key="key.only.acme01"),
        name_of("subject"),
        201,
        caller=_agent,
        twin=made_up_subject,
        creates=True,
    ),
    _body(
        "POST /v1/principals",
        "display_name",
        lambda side, v: {"display_name": v},
        name_of("principal"),
        201,
        kind=NAME,
        twin=same_length_name,
        creates=True,
    ),
    _body(
        "POST /v1/principals",
        "external subject",
        lambda side, v: {
            "display_name": "mapped",
            "external_issuer": TRUSTED_ISSUER,
            "external_subject": v,
        },
        name_of("external"),
        201,
        kind=NAME,
        twin=same_length_name,
        creates=True,
    ),
    _body(
        "POST /v1/spaces",
        "name",
        lambda side, v: {"name": v},
        name_of("space"),
        201,
        kind=NAME,
        twin=same_length_name,
        creates=True,
    ),
    _body(
        "POST /v1/teams",
        "name",
        lambda side, v: {"name": v},
        name_of("team"),
        201,
        kind=NAME,
        twin=same_length_name,
        creates=True,
    ),
)
"""Name probes whose call succeeds and makes something in the caller's tenant (a team named
like the other tenant's): run on a world of their own (test_cross_tenant_names.py), so what
they make never meets the other probes."""

NAMES_NOTHING = {
    "GET /healthz": "a liveness probe, no token, no tenant",
    "GET /readyz": "a readiness probe, no token, no tenant",
    "GET /schema": "the API description, the same for every caller",
    "GET /schema/openapi.json": "the API description, the same for every caller",
    "GET /schema/openapi.yaml": "the API description, the same for every caller",
    "GET /.well-known/jwks.json": "the issuer's public keys, one set for the deployment",
    "GET /.well-known/oauth-authorization-server": "RFC 8414 metadata, one per deployment",
    "GET /.well-known/oauth-protected-resource": "RFC 9728 metadata, one per deployment",
    "GET /.well-known/oauth-protected-resource/mcp": "RFC 9728 metadata, one per deployment",
    "/mcp": "every MCP tool has its probes in test_mcp_cross_tenant.py",
    "GET /v1/tenants": "a platform route: a tenant admin gets 403 platform-admin-required, the "
    "same bytes for everybody (test_access.py); it names nothing",
    "POST /v1/tenants": "a platform route: a tenant admin gets 403 platform-admin-required, the "
    "same bytes for everybody (test_access.py); a tenant's name is not unique",
    "POST /v1/issuers": "(issuer, audience) is unique across the platform, so registering a "
    "pair another tenant holds is 409 issuer-taken, byte-identical to a pair the caller's own "
    "tenant holds and never naming the holder (tests/integration/issuers); docs/security.md",
}
"""Routes that take nothing a caller names (each still answers the same for every tenant)."""

TOKEN_PROBES: tuple[Probe, ...] = tuple(p for p in PROBES if p.kind == ID)
"""Run the other way round too: the other tenant's valid token against the caller's ids."""

DELEGATED_PROBES: tuple[Probe, ...] = tuple(p for p in TOKEN_PROBES if p.caller is _agent)
"""And with the other tenant's delegated token (its agent acting for its user): the memory
routes, the only ones a delegated token may call (it never carries an admin scope)."""
