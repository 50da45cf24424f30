"""Platform routes for tenants (scope `manage:tenant` on the platform tenant)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import ResponseHeader, State
from litestar.params import FromQuery, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.erasure.controller import finalize_after
from service.erasure.service import ErasureService, Finalisation
from service.http.deps import CallDep, Rt
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.quotas.schemas import Limits
from service.tenants import operations as ops
from service.tenants.schemas import (
    DeletionPlan,
    TenantCreate,
    TenantCreated,
    TenantLimits,
    TenantOut,
    TenantPage,
    TenantUpdate,
)
from service.tenants.service import TenantEraser, TenantService, deletion_key

AuthedRequest = Request[Principal, VerifiedToken, State]
NO_STORE = [ResponseHeader(name="Cache-Control", value="no-store")]


def _service(
    _: AuthedRequest, call: CallDep, runtime: Rt, eraser: TenantEraser | None = None
) -> TenantService:
    return TenantService(
        call.db,
        call,
        runtime.settings.memory,
        deletion_key(runtime.kek.raw),
        facts=call.facts,
        eraser=eraser,
    )


class TenantController(Controller):
    path = "/v1/tenants"
    tags = ["platform"]

    @post("/", response_headers=NO_STORE, **route(ops.TENANT_CREATE))
    async def create_tenant(
        self, request: AuthedRequest, data: JSONBody[TenantCreate], call: CallDep, runtime: Rt
    ) -> TenantCreated:
        """Create a tenant and its first tenant admin (a user with an admin client holding
        every scope). The client secret is shown once."""
        return await _service(request, call, runtime).create(data)

    @get("/", **route(ops.TENANT_LIST))
    async def list_tenants(
        self,
        request: AuthedRequest,
        call: CallDep,
        runtime: Rt,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[
            int | None, QueryParameter(description="Page size (1-100, default 50).")
        ] = None,
    ) -> TenantPage:
        """List the tenants (retired ones excluded), with cursor pagination."""
        return await _service(request, call, runtime).list_page(cursor, limit)

    @get("/{tenant_id:str}", **route(ops.TENANT_GET))
    async def get_tenant(
        self, request: AuthedRequest, tenant_id: PathId, call: CallDep, runtime: Rt
    ) -> TenantOut:
        """Get one tenant: name, state and settings."""
        return await _service(request, call, runtime).get(parse_id(tenant_id))

    @patch("/{tenant_id:str}", **route(ops.TENANT_UPDATE))
    async def update_tenant(
        self,
        request: AuthedRequest,
        tenant_id: PathId,
        data: JSONBody[TenantUpdate],
        call: CallDep,
        runtime: Rt,
    ) -> TenantOut:
        """Rename a tenant or change its settings (merged key by key; null resets a key)."""
        return await _service(request, call, runtime).update(parse_id(tenant_id), data)

    @post("/{tenant_id:str}/disable", status_code=HTTP_200_OK, **route(ops.TENANT_DISABLE))
    async def disable_tenant(
        self, request: AuthedRequest, tenant_id: PathId, call: CallDep, runtime: Rt
    ) -> TenantOut:
        """Disable a tenant: every token of it stops on its next request. Idempotent."""
        return await _service(request, call, runtime).disable(parse_id(tenant_id))

    @post("/{tenant_id:str}/enable", status_code=HTTP_200_OK, **route(ops.TENANT_ENABLE))
    async def enable_tenant(
        self, request: AuthedRequest, tenant_id: PathId, call: CallDep, runtime: Rt
    ) -> TenantOut:
        """Enable a disabled tenant again. Idempotent."""
        return await _service(request, call, runtime).enable(parse_id(tenant_id))

    @delete("/{tenant_id:str}", status_code=HTTP_200_OK, **route(ops.TENANT_DELETE))
    async def delete_tenant(
        self,
        request: AuthedRequest,
        tenant_id: PathId,
        call: CallDep,
        runtime: Rt,
        confirm: Annotated[
            str | None,
            QueryParameter(
                description="The plan's confirmation value; without it, the plan only.",
                max_length=100,
            ),
        ] = None,
        audit: Annotated[
            Literal["keep", "drop"],
            QueryParameter(
                description="With `confirm`: keep the tenant's audit chain (content-free, its "
                "pseudonyms unresolvable; the default) or drop it too."
            ),
        ] = "keep",
    ) -> Response[DeletionPlan]:
        """Without `confirm`: a dry-run plan of what would be erased, changing nothing. With
        the plan's `confirm` (the tenant disabled, within its expiry): the tenant is erased in
        one transaction and the answer carries the signed receipt; VACUUM and the files'
        second scan follow the answer (GET /v1/tenants/{id}/proof)."""
        done: list[Finalisation] = []
        erasure = ErasureService(call.db, runtime, facts=call.facts)

        async def erase(tenant_id: uuid.UUID) -> tuple[uuid.UUID, str]:
            erasure_id, receipt, finalisation = await erasure.erase_tenant(
                request.user, request.auth.subject, tenant_id, drop_audit=audit == "drop"
            )
            done.append(finalisation)
            return erasure_id, receipt.receipt

        service = _service(request, call, runtime, eraser=erase)
        plan = await service.delete(parse_id(tenant_id), confirm)
        background = BackgroundTask(finalize_after, runtime, call, done[0]) if done else None
        return Response(plan, background=background, headers={"Cache-Control": "no-store"})

    @get("/{tenant_id:str}/proof", response_headers=NO_STORE, **route(ops.TENANT_PROOF))
    async def tenant_proof(
        self, request: AuthedRequest, tenant_id: PathId, call: CallDep, runtime: Rt
    ) -> dict[str, Any]:
        """What a deleted tenant's erasure left, table by table (the retired tenant row, and
        its audit chain unless dropped, are all that may stay), with the erasure's evidence:
        VACUUM and the database files' byte scan before and after, or why it could not look."""
        target = parse_id(tenant_id)
        await _service(request, call, runtime).get_any(target)
        return await ErasureService(call.db, runtime, facts=call.facts).tenant_proof(
            request.user, target
        )

    @get("/{tenant_id:str}/limits", **route(ops.TENANT_LIMITS_GET))
    async def get_limits(
        self, request: AuthedRequest, tenant_id: PathId, call: CallDep, runtime: Rt
    ) -> TenantLimits:
        """A tenant's quotas (its own and its clients'), and the memories and bytes it holds."""
        return await _service(request, call, runtime).limits(parse_id(tenant_id))

    @put("/{tenant_id:str}/limits", **route(ops.TENANT_LIMITS_SET))
    async def set_limits(
        self,
        request: AuthedRequest,
        tenant_id: PathId,
        data: JSONBody[Limits],
        call: CallDep,
        runtime: Rt,
    ) -> Limits:
        """Replace the tenant's quotas; every replica applies them within
        `MEMGATE_QUOTA_CONFIG_SECONDS` (docs/tenants.md, Quotas and rate limits)."""
        target = parse_id(tenant_id)
        limits = await _service(request, call, runtime).set_limits(target, data)
        runtime.quotas.forget(target)
        return limits

    @put("/{tenant_id:str}/clients/{client_id:str}/limits", **route(ops.CLIENT_LIMITS_SET))
    async def set_client_limits(
        self,
        request: AuthedRequest,
        tenant_id: PathId,
        client_id: PathId,
        data: JSONBody[Limits],
        call: CallDep,
        runtime: Rt,
    ) -> Limits:
        """Replace one client's quotas (requests, concurrency, token requests)."""
        target = parse_id(tenant_id)
        service = _service(request, call, runtime)
        limits = await service.set_limits(target, data, parse_id(client_id))
        runtime.quotas.forget(target)
        return limits
