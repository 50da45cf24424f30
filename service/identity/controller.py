"""Admin routes for principals and OAuth clients (scope `manage:policy`)."""

from __future__ import annotations

from litestar import Controller, Request, get, post
from litestar.datastructures import ResponseHeader, State
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_201_CREATED

from service.auth.guards import requires
from service.auth.principal import Principal
from service.auth.scopes import Scope
from service.auth.tokens import VerifiedToken
from service.http.deps import Db
from service.http.params import parse_id
from service.identity.schemas import (
    ClientCreate,
    ClientCreated,
    ClientList,
    ClientOut,
    PrincipalCreate,
    PrincipalList,
    PrincipalOut,
)
from service.identity.service import IdentityService

AuthedRequest = Request[Principal, VerifiedToken, State]
_ADMIN = [requires(Scope.MANAGE_POLICY)]


def _service(request: AuthedRequest, db: Db) -> IdentityService:
    return IdentityService(db, request.user.tenant_id)


class PrincipalController(Controller):
    path = "/v1/principals"
    tags = ["admin"]

    @post("/", status_code=HTTP_201_CREATED, guards=_ADMIN)
    async def create_principal(
        self, request: AuthedRequest, data: JSONBody[PrincipalCreate], db: Db
    ) -> PrincipalOut:
        """Create a user, agent or service principal in your tenant, with its personal space."""
        return await _service(request, db).create_principal(data)

    @get("/", guards=_ADMIN)
    async def list_principals(self, request: AuthedRequest, db: Db) -> PrincipalList:
        """List the principals of your tenant (first 500, oldest first)."""
        return PrincipalList(items=await _service(request, db).list_principals())

    @get("/{principal_id:str}", guards=_ADMIN)
    async def get_principal(
        self, request: AuthedRequest, principal_id: FromPath[str], db: Db
    ) -> PrincipalOut:
        """Get one principal of your tenant."""
        return await _service(request, db).get_principal(parse_id(principal_id))


class ClientController(Controller):
    path = "/v1/clients"
    tags = ["admin"]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        guards=_ADMIN,
        response_headers=[ResponseHeader(name="Cache-Control", value="no-store")],
    )
    async def create_client(
        self, request: AuthedRequest, data: JSONBody[ClientCreate], db: Db
    ) -> ClientCreated:
        """Register an OAuth client serving one principal. The secret is in this answer only."""
        return await _service(request, db).create_client(request.user, data)

    @get("/", guards=_ADMIN)
    async def list_clients(self, request: AuthedRequest, db: Db) -> ClientList:
        """List the clients of your tenant (first 500). Secrets are never shown again."""
        return ClientList(items=await _service(request, db).list_clients())

    @get("/{client_id:str}", guards=_ADMIN)
    async def get_client(
        self, request: AuthedRequest, client_id: FromPath[str], db: Db
    ) -> ClientOut:
        """Get one client of your tenant."""
        return await _service(request, db).get_client(parse_id(client_id))

    @post("/{client_id:str}/disable", status_code=200, guards=_ADMIN)
    async def disable_client(
        self, request: AuthedRequest, client_id: FromPath[str], db: Db
    ) -> ClientOut:
        """Disable a client: new tokens are refused and its live tokens stop working at once."""
        return await _service(request, db).set_client_enabled(
            request.user, parse_id(client_id), enabled=False
        )

    @post("/{client_id:str}/enable", status_code=200, guards=_ADMIN)
    async def enable_client(
        self, request: AuthedRequest, client_id: FromPath[str], db: Db
    ) -> ClientOut:
        """Re-enable a disabled client: it may get tokens again (its old tokens too, until they
        expire)."""
        return await _service(request, db).set_client_enabled(
            request.user, parse_id(client_id), enabled=True
        )
