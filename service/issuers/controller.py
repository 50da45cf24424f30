"""Admin routes for the tenant's external identity providers (scope `manage:policy`)."""

from __future__ import annotations

from litestar import Controller, Request, delete, get, post
from litestar.datastructures import State
from litestar.params import JSONBody

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.http.deps import CallDep, provide_runtime
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.issuers import operations as ops
from service.issuers.schemas import IssuerCreate, IssuerList, IssuerOut
from service.issuers.service import IssuerService

AuthedRequest = Request[Principal, VerifiedToken, State]


def _service(request: AuthedRequest, call: CallDep) -> IssuerService:
    settings = provide_runtime(request.app.state).settings
    return IssuerService(
        call.db,
        request.user,
        own_issuer=settings.server.public_url,
        operator_issuers=settings.auth.trusted_external_issuers,
        allow_loopback=settings.auth.tenant_issuers_allow_loopback,
        facts=call.facts,
    )


class IssuerController(Controller):
    path = "/v1/issuers"
    tags = ["admin"]

    @post("/", **route(ops.ISSUER_CREATE))
    async def create_issuer(
        self, request: AuthedRequest, data: JSONBody[IssuerCreate], call: CallDep
    ) -> IssuerOut:
        """Register your IdP (once per `iss`): tokens carrying its `iss` and this `aud`, signed
        by a key of its JWKS, belong to your tenant from the next request, for principals mapped
        to it. An `iss` principals are already mapped to needs `manage:tenant` too (403)."""
        return await _service(request, call).create(data)

    @get("/", **route(ops.ISSUER_LIST))
    async def list_issuers(self, request: AuthedRequest, call: CallDep) -> IssuerList:
        """List your tenant's external identity providers (at most 10)."""
        return IssuerList(items=await _service(request, call).list())

    @get("/{issuer_id:str}", **route(ops.ISSUER_GET))
    async def get_issuer(
        self, request: AuthedRequest, issuer_id: PathId, call: CallDep
    ) -> IssuerOut:
        """Get one external identity provider of your tenant."""
        return await _service(request, call).get(parse_id(issuer_id))

    @delete("/{issuer_id:str}", **route(ops.ISSUER_DELETE))
    async def delete_issuer(self, request: AuthedRequest, issuer_id: PathId, call: CallDep) -> None:
        """Delete an external identity provider: its tokens are refused from the next
        request. Not the one your last working policy admin logs in with (409); one principals
        are mapped to needs `manage:tenant` too, every admin scope for an admin's (403)."""
        await _service(request, call).delete(parse_id(issuer_id))
