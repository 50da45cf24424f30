"""create_app(): the one place where routes, middleware, dependencies and the problem map meet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from service.audit.checkpoints import checkpoint_periodically
from service.audit.controller import AuditController
from service.auth.controller import OAuthController
from service.auth.middleware import BearerAuthentication
from service.erasure.controller import ErasureController
from service.http.answers import check_answered_problems
from service.http.audit import check_every_route_is_an_operation, http_calls
from service.http.body import declare_query_parameters, strict_request
from service.http.deps import provide_call, provide_db, provide_runtime
from service.http.errors import handle_exception
from service.http.headers import security_headers
from service.http.health import HealthController
from service.http.openapi_doc import SpecJson, SpecYaml
from service.identity.controller import ClientController, PrincipalController
from service.issuers.controller import IssuerController
from service.jobs.controller import JobController
from service.mcp.controller import mcp_routes
from service.memory.controller import (
    MemoryController,
    approve_proposal,
    list_proposals,
    reject_proposal,
    remember_many,
)
from service.observability.logging import request_context_middleware
from service.observability.telemetry import otel_asgi
from service.policy.controller import (
    PermissionController,
    RoleController,
    SpaceController,
    TeamController,
)
from service.revocation.controller import reinstate_memory, revoke_memory
from service.runtime import Runtime
from service.settings import ServerSettings
from service.tenants.controller import TenantController

API_VERSION = "0.1.0"


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="memgate",
        version=API_VERSION,
        description=(
            "Multi-tenant memory for AI agents. Every call needs a bearer token from "
            "/oauth/token; errors are RFC 9457 application/problem+json."
        ),
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer", bearer_format="JWT")
            }
        ),
        security=[{"bearer": []}],
        use_handler_docstrings=True,
        # The machine-readable spec only (the committed document, which describes these
        # routes): no HTML doc UIs that pull scripts from a CDN, no HTML 404 page.
        render_plugins=[SpecJson(), SpecYaml()],
    )


@asynccontextmanager
async def _background(app: Litestar) -> AsyncIterator[None]:
    """Signs audit checkpoints while the app runs (off when the interval is 0)."""
    runtime: Runtime | None = app.state.runtime
    every = runtime.settings.audit.checkpoint_seconds if runtime else 0
    if runtime is None or every <= 0:
        yield
        return
    task = asyncio.create_task(
        checkpoint_periodically(runtime.sessionmaker, runtime.kek, every_seconds=every)
    )
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


@asynccontextmanager
async def _job_worker(app: Litestar) -> AsyncIterator[None]:
    """Runs queued and scheduled jobs while the app runs (off when the poll interval is 0)."""
    from service.jobs.registry import JOBS
    from service.jobs.scheduler import work

    runtime: Runtime | None = app.state.runtime
    if runtime is None or runtime.settings.jobs.poll_seconds <= 0:
        yield
        return
    task = asyncio.create_task(work(runtime, JOBS))
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


def create_app(runtime: Runtime | None = None) -> Litestar:
    """The app; `runtime=None` builds it only to render the OpenAPI document."""
    auth = DefineMiddleware(
        BearerAuthentication,
        exclude_from_auth_key="exclude_from_auth",
        exclude=["^/schema"],
    )
    mcp, mcp_lifespan = mcp_routes(runtime)
    app = Litestar(
        route_handlers=[
            HealthController,
            OAuthController,
            MemoryController,
            remember_many,
            list_proposals,
            approve_proposal,
            reject_proposal,
            revoke_memory,
            reinstate_memory,
            PrincipalController,
            ClientController,
            IssuerController,
            AuditController,
            TeamController,
            SpaceController,
            PermissionController,
            RoleController,
            TenantController,
            JobController,
            ErasureController,
            mcp,
        ],
        dependencies={
            "call": Provide(provide_call, sync_to_thread=False),
            "db": Provide(provide_db, sync_to_thread=False),
            "runtime": Provide(provide_runtime, sync_to_thread=False),
        },
        middleware=[auth],
        before_request=strict_request,
        exception_handlers={Exception: handle_exception},
        # Off: no /schema routes (MEMGATE_SCHEMA_DOCS=0, the chart's default).
        openapi_config=openapi_config()
        if runtime is None or runtime.settings.server.schema_docs
        else None,
        request_max_body_size=(
            runtime.settings.server.max_body_bytes if runtime else ServerSettings.max_body_bytes
        ),
        state=State({"runtime": runtime}),
        lifespan=[_background, _job_worker, mcp_lifespan],
        debug=False,
    )
    declare_query_parameters(app)
    # Outside Litestar's own exception handling, so the access line and X-Request-Id cover every
    # answer: 401s from authentication and 404/405s for unknown routes included.
    handler = app.asgi_handler
    if runtime is not None:
        check_every_route_is_an_operation(app)
        # Inside the access log (which reports the status the caller really got: a 503 when the
        # call could not be recorded).
        handler = http_calls(handler, runtime)
    tls = runtime is not None and runtime.settings.server.tls_enabled
    app.asgi_handler = request_context_middleware(security_headers(handler, hsts=tls))
    # Tests only (off: the app itself): each problem answered is one its operation declares.
    app.asgi_handler = check_answered_problems(app.asgi_handler)
    # The OpenTelemetry server span outermost, so the access line is written inside it and
    # carries its trace id.
    app.asgi_handler = otel_asgi(app.asgi_handler)
    return app
