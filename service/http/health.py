"""Liveness and readiness probes.

Anyone who reaches the listener may call them, so they answer only `ok` or `not ready`; why a
replica is not ready (database unreachable, schema behind, a login that is too powerful) goes
to the log, where the operator looks and a bystander cannot. They are not operations (no audit
row, no token): their operation ids and `security: []` are declared here, for openapi.yaml.
"""

from __future__ import annotations

import structlog
from litestar import Controller, Response, get
from litestar.openapi.datastructures import ResponseSpec
from sqlalchemy.exc import SQLAlchemyError

from service.db.migrate import at_head
from service.http.deps import Rt

_log = structlog.get_logger("memgate.health")
NOT_READY = {"status": "not ready"}


def _not_ready(reason: str) -> Response[dict[str, str]]:
    _log.warning("not_ready", reason=reason)
    return Response(NOT_READY, status_code=503)


class HealthController(Controller):
    tags = ["operations"]
    opt = {"exclude_from_auth": True}

    @get(
        "/healthz",
        operation_id="checkLiveness",
        summary="Liveness probe",
        security=[],
        opt={"audit_exempt": True},
    )
    async def healthz(self) -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @get(
        "/readyz",
        operation_id="checkReadiness",
        summary="Readiness probe",
        security=[],
        opt={"audit_exempt": True},
        responses={
            503: ResponseSpec(
                dict[str, str], description="Not ready (why is logged)", generate_examples=False
            )
        },
    )
    async def readyz(self, runtime: Rt) -> Response[dict[str, str]]:
        """The service can take requests: `ok`, or 503 `not ready` (the reason is logged)."""
        try:
            async with runtime.sessionmaker() as session:
                ready = await at_head(session)
        except (SQLAlchemyError, OSError):
            return _not_ready("database unreachable")
        if not ready:
            return _not_ready("migrations not at head")
        if runtime.login_problems:
            # The app could leave its non-owner role (RESET ROLE): audit and RLS guards are void.
            return _not_ready("database login too powerful")
        return Response({"status": "ok"})
