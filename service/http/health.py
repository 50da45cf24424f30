"""Liveness and readiness probes."""

from __future__ import annotations

from litestar import Controller, Response, get
from sqlalchemy.exc import SQLAlchemyError

from service.db.migrate import at_head
from service.http.deps import Rt


class HealthController(Controller):
    tags = ["operations"]
    opt = {"exclude_from_auth": True}

    @get("/healthz", opt={"audit_exempt": True})
    async def healthz(self) -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @get("/readyz", opt={"audit_exempt": True})
    async def readyz(self, runtime: Rt) -> Response[dict[str, str]]:
        """The database answers and its schema is at the migrations' head."""
        try:
            async with runtime.sessionmaker() as session:
                ready = await at_head(session)
        except (SQLAlchemyError, OSError):
            return Response({"status": "database unreachable"}, status_code=503)
        if not ready:
            return Response({"status": "migrations not at head"}, status_code=503)
        if runtime.login_problems:
            # The app could leave its non-owner role (RESET ROLE): audit and RLS guards are void.
            return Response({"status": "database login too powerful"}, status_code=503)
        return Response({"status": "ready"})
