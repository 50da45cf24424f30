"""`memgate tenants create|list|disable|enable`: the operator acts as the platform admin.

The command presents the platform admin's client credentials from the data dir (the first
start's bootstrap admin, `admin-client.json` and its 0600 secret file) and is authenticated the
way a token request is (the client's secret against its hash, through `memgate_token_client`),
then every action is a call of its own operation (`open_call`): the entrance statement proves
the principal, client and tenant live, the platform check runs, and the audit row goes to the
platform chain like the API's. It talks to the database, not the HTTP server, so it works
against a running `serve`'s embedded cluster (which it leaves running) as well as a stopped one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import anyio

from service.auth.issuer import load_client, verify_secret
from service.auth.scopes import Scope
from service.auth.tokens import TrustedIssuer, VerifiedToken
from service.calls import Call, open_call
from service.operations import Operation
from service.problems import MalformedId
from service.runtime import Runtime
from service.tenants import operations as ops
from service.tenants.schemas import TenantCreate
from service.tenants.service import TenantService, deletion_key

ROUTE = "memgate tenants"


class OperatorRefused(Exception):
    """The data dir's credentials are not a working platform admin client."""


@dataclass(frozen=True)
class Operator:
    client_id: str
    secret: str


async def _token(runtime: Runtime, operator: Operator) -> VerifiedToken:
    """The operator's identity, proven by its client secret, as the token a client-credentials
    grant would have issued it (scope `manage:tenant` only, nothing signed: it never leaves
    this process)."""
    async with runtime.sessionmaker() as session:
        client = await load_client(session, operator.client_id)
    matches = client is not None and await anyio.to_thread.run_sync(
        verify_secret, client.secret_hash, operator.secret
    )
    if client is None or not matches:
        raise OperatorRefused("the platform admin client is unknown, disabled or its secret wrong")
    if Scope.MANAGE_TENANT not in client.allowed_scopes or client.kind != "admin":
        raise OperatorRefused("the client is not an admin client holding manage:tenant")
    issuer = TrustedIssuer(
        issuer=runtime.issuer.issuer,
        audience=runtime.issuer.audience,
        algorithms=(),
        keys=runtime.embedded_keys,
        embedded=True,
    )
    return VerifiedToken(
        issuer=issuer,
        tenant_id=client.tenant_id,
        subject=str(client.principal_id),
        client_id=client.client_id,
        scopes=frozenset({Scope.MANAGE_TENANT.value}),
        token_id=f"cli-{uuid.uuid4()}",
        act=None,
        claims={},
    )


async def run(runtime: Runtime, operator: Operator, action: str, argument: str | None) -> Any:
    """Run one tenant command; its result as the API would answer it (msgspec structs)."""
    token = await _token(runtime, operator)
    operation = _OPERATIONS[action]
    async with open_call(
        runtime, operation, token=token, method="CLI", route=f"{ROUTE} {action}"
    ) as call:
        assert operation.check is not None
        await operation.check(call)
        return await _act(_service(runtime, call), action, argument)


_OPERATIONS: dict[str, Operation] = {
    "create": ops.TENANT_CREATE,
    "list": ops.TENANT_LIST,
    "disable": ops.TENANT_DISABLE,
    "enable": ops.TENANT_ENABLE,
}


def _service(runtime: Runtime, call: Call) -> TenantService:
    return TenantService(
        call.db,
        call,
        runtime.settings.memory,
        deletion_key(runtime.kek.raw),
        facts=call.facts,
    )


async def _act(service: TenantService, action: str, argument: str | None) -> Any:
    if action == "create":
        return await service.create(TenantCreate(name=str(argument)))
    if action == "list":
        return await _all(service)
    tenant_id = _tenant_id(str(argument))
    if action == "disable":
        return await service.disable(tenant_id)
    return await service.enable(tenant_id)


async def _all(service: TenantService) -> list[Any]:
    items: list[Any] = []
    cursor: str | None = None
    while True:
        page = await service.list_page(cursor, None)
        items += page.items
        if page.next_cursor is None:
            return items
        cursor = page.next_cursor


def _tenant_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise MalformedId(f"'{raw[:64]}' is not a tenant id (a UUID).") from None
