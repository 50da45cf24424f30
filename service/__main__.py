"""The `memgate` command: serve | migrate | revision | keys rotate | token | audit | openapi."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from service.db.session import with_database
from service.settings import Settings

if TYPE_CHECKING:
    from service.runtime import Runtime

T = TypeVar("T")
ADMIN_CLIENT_FILE = "admin-client.json"
ADMIN_SECRET_FILE = "admin-client.secret"  # noqa: S105 (a file name, not a secret)
EMBEDDED_DATABASE = "memgate"


@dataclass(frozen=True)
class DatabaseUrls:
    owner: str
    """Runs the migrations (owns the tables)."""
    app: str | None
    """The app's login (a member of the app role only); None: provision it after migrating."""

    def app_login(self, settings: Settings) -> str:
        if self.app is not None:
            return self.app
        from service.db.roles import provision_app_login

        return provision_app_login(self.owner, settings.database.app_role)


@contextmanager
def database_urls(settings: Settings) -> Iterator[DatabaseUrls]:
    """`DATABASE_URL` (the app's login) and `MEMGATE_MIGRATION_DATABASE_URL` (the owner; default
    the same URL) when set, nothing started; otherwise the embedded cluster, where the service
    makes the app's login itself, stopped cleanly on exit."""
    database = settings.database
    if database.url:
        yield DatabaseUrls(owner=database.migration_url or database.url, app=database.url)
        return
    from service.db.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(database.data_dir)
    admin_url = embedded.start()
    try:
        yield DatabaseUrls(owner=_ensure_database(admin_url, EMBEDDED_DATABASE), app=None)
    finally:
        embedded.stop()


def _ensure_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(admin_url, name)


def _write_private(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(content)


@dataclass(frozen=True)
class AdminClient:
    tenant_id: str
    client_id: str
    secret_file: Path


async def _bootstrap(settings: Settings, runtime: Runtime) -> AdminClient | None:
    """On first start: a default tenant with an admin client; its secret goes to a 0600 file."""
    from service.identity.service import any_tenant, create_tenant

    data_dir = settings.database.data_dir
    async with runtime.sessionmaker.begin() as session:
        if not await any_tenant(session):
            created = await create_tenant(session, "default")
            _write_private(data_dir / ADMIN_SECRET_FILE, created.client_secret + "\n")
            _write_private(
                data_dir / ADMIN_CLIENT_FILE,
                json.dumps(
                    {"tenant_id": str(created.tenant_id), "client_id": str(created.client_id)}
                ),
            )
    info_file = data_dir / ADMIN_CLIENT_FILE
    if not info_file.exists():
        return None
    info = json.loads(info_file.read_text())
    return AdminClient(info["tenant_id"], info["client_id"], data_dir / ADMIN_SECRET_FILE)


def _print_banner(settings: Settings, admin: AdminClient | None, started: float) -> None:
    url = settings.server.public_url
    lines = [f"memgate is ready at {url} (started in {time.perf_counter() - started:.1f} s)"]
    if admin is None:
        lines.append("  bootstrap was done elsewhere; use your admin client's credentials.")
    else:
        lines += [
            f"  tenant:          {admin.tenant_id}",
            f"  admin client id: {admin.client_id}",
            f"  admin secret:    in {admin.secret_file} (mode 0600)",
            "  get a token:",
            f'    curl -s -X POST {url}/oauth/token -u "{admin.client_id}:$(cat '
            f'{admin.secret_file})" -d grant_type=client_credentials',
            "  or: memgate token",
        ]
    metrics = settings.observability
    if metrics.metrics_port:
        lines.append(
            f"  metrics (no token, keep private): http://{metrics.metrics_host}:"
            f"{metrics.metrics_port}/metrics"
        )
    lines.append("  stop with Ctrl-C (the embedded database stops with it)")
    print("\n".join(lines), flush=True)


async def _serve(settings: Settings, url: str, started: float) -> None:
    from service.app import create_app
    from service.embeddings import create_embedder
    from service.observability.metrics import create_metrics_app
    from service.runtime import build_runtime
    from service.serving import MetricsServer, listener_config, public_server

    runtime = await build_runtime(settings, url, create_embedder(settings.embedding))
    observability = settings.observability
    scraping: asyncio.Task[None] | None = None
    metrics = MetricsServer(
        listener_config(
            create_metrics_app(), observability.metrics_host, observability.metrics_port
        )
    )
    try:
        admin = await _bootstrap(settings, runtime)
        if observability.metrics_port:
            scraping = asyncio.create_task(metrics.serve())
        server = public_server(
            listener_config(create_app(runtime), settings.server.host, settings.server.port)
        )
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():  # noqa: ASYNC110 (uvicorn has no event)
            await asyncio.sleep(0.05)
        if server.started:
            _print_banner(settings, admin, started)
        await serving
    finally:
        if scraping is not None:
            metrics.should_exit = True
            await scraping
        await runtime.close()


def cmd_serve(settings: Settings) -> int:
    from service.db.migrate import upgrade
    from service.observability.logging import configure_logging
    from service.observability.telemetry import configure_telemetry

    started = time.perf_counter()
    configure_logging(json_logs=settings.server.json_logs)
    configure_telemetry(settings.observability)
    with database_urls(settings) as urls:
        upgrade(urls.owner)
        app_url = urls.app_login(settings)
        with suppress(KeyboardInterrupt):
            asyncio.run(_serve(settings, app_url, started))
    return 0


def cmd_migrate(settings: Settings) -> int:
    from service.db.migrate import upgrade

    with database_urls(settings) as urls:
        upgrade(urls.owner)
    print("migrations at head")
    return 0


def cmd_revision(settings: Settings, message: str) -> int:
    from service.db.migrate import new_revision, upgrade

    with database_urls(settings) as urls:
        upgrade(urls.owner)
        new_revision(urls.owner, message)
    return 0


def _with_keys(settings: Settings, job: Callable[[Any, Any], Awaitable[T]]) -> T:
    """Run `job(sessionmaker, kek)` against the database as the app role, outside `serve`."""
    from service.auth.keys import KeyEncryptionKey
    from service.db.session import create_engine, create_sessionmaker

    async def run(url: str) -> T:
        engine = create_engine(url, pool_size=1, role=settings.database.app_role)
        kek = KeyEncryptionKey.from_setting_or_file(
            settings.auth.key_encryption_key, settings.database.data_dir
        )
        try:
            return await job(create_sessionmaker(engine), kek)
        finally:
            await engine.dispose()

    with database_urls(settings) as urls:
        return asyncio.run(run(urls.app_login(settings)))


def cmd_rotate_keys(settings: Settings) -> int:
    from service.runtime import rotate_signing_keys

    kid = _with_keys(settings, lambda sessions, kek: rotate_signing_keys(settings, sessions, kek))
    print(f"active signing key is now {kid}")
    return 0


def cmd_audit_checkpoint(settings: Settings) -> int:
    """For a CronJob (with MEMGATE_AUDIT_CHECKPOINT_SECONDS=0 on the API pods)."""
    from service.audit.checkpoints import run_checkpoints

    made = _with_keys(settings, run_checkpoints)
    print(f"signed {made} audit checkpoint(s)")
    return 0


def cmd_token(settings: Settings, scope: str | None) -> int:
    import httpx

    data_dir = settings.database.data_dir
    info = json.loads((data_dir / ADMIN_CLIENT_FILE).read_text())
    secret = (data_dir / ADMIN_SECRET_FILE).read_text().strip()
    form = {"grant_type": "client_credentials"}
    if scope:
        form["scope"] = scope
    response = httpx.post(
        f"{settings.server.public_url}/oauth/token",
        data=form,
        auth=(info["client_id"], secret),
        timeout=10,
    )
    if response.is_error:
        print(response.text, file=sys.stderr)
        return 1
    print(response.json()["access_token"])
    return 0


def cmd_openapi(path: Path) -> int:
    from service.http.openapi_doc import render_openapi

    path.write_text(render_openapi())
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memgate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="start memgate (embedded database unless DATABASE_URL)")
    commands.add_parser("migrate", help="run database migrations to head")
    revision = commands.add_parser("revision", help="autogenerate a migration from the models")
    revision.add_argument("-m", "--message", required=True)
    keys = commands.add_parser("keys", help="signing keys of the embedded issuer")
    keys.add_argument("action", choices=["rotate"])
    token = commands.add_parser("token", help="print an access token for the bootstrap admin")
    token.add_argument("--scope", default=None)
    audit = commands.add_parser("audit", help="the audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_commands.add_parser(
        "verify", help="check an export of GET /v1/audit/export (no database needed)"
    )
    verify.add_argument("export", help="NDJSON file from GET /v1/audit/export")
    verify.add_argument("--checkpoint", help="JSON from GET /v1/audit/checkpoints/latest")
    verify.add_argument("--keys", help="JWKS from GET /v1/audit/keys")
    audit_commands.add_parser(
        "checkpoint", help="sign a checkpoint for every tenant whose audit chain grew"
    )
    openapi = commands.add_parser("openapi", help="write the OpenAPI document")
    openapi.add_argument("--output", type=Path, default=Path("openapi.yaml"))
    args = parser.parse_args(argv)

    settings = Settings.from_env()
    if args.command == "serve":
        return cmd_serve(settings)
    if args.command == "migrate":
        return cmd_migrate(settings)
    if args.command == "revision":
        return cmd_revision(settings, args.message)
    if args.command == "keys":
        return cmd_rotate_keys(settings)
    if args.command == "audit" and args.audit_command == "verify":
        from service.audit.independent import run

        return run(args.export, args.checkpoint, args.keys)
    if args.command == "audit":
        return cmd_audit_checkpoint(settings)
    if args.command == "token":
        return cmd_token(settings, args.scope)
    return cmd_openapi(args.output)


if __name__ == "__main__":
    sys.exit(main())
