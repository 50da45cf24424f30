"""The `memgate` command: serve | migrate | revision | keys rotate | token | audit | tenants |
erasure | jobs | openapi."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
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
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from service.auth.keys import KeyEncryptionKey
    from service.http.tls import SelfSigned
    from service.identity.service import SuppliedCredentials
    from service.runtime import Runtime

T = TypeVar("T")
ADMIN_CLIENT_FILE = "admin-client.json"
ADMIN_SECRET_FILE = "admin-client.secret"  # noqa: S105 (a file name, not a secret)
EMBEDDED_DATABASE = "memgate"
WORKER_START_SECONDS = 120.0
"""How long `serve --workers N` waits for every worker to accept (each loads its embedder)."""


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

    def existing_app_login(self) -> str:
        """The app's login without making it (`serve --no-migrate`: `memgate migrate` did)."""
        if self.app is not None:
            return self.app
        from service.db.roles import app_login_url

        return app_login_url(self.owner)


class SharedKeyMissing(SystemExit):
    """DATABASE_URL is set but MEMGATE_KEY_ENCRYPTION_KEY is not."""

    def __init__(self) -> None:
        super().__init__(
            "memgate: DATABASE_URL is set but MEMGATE_KEY_ENCRYPTION_KEY is not: every replica "
            "and the migration Job must seal and open the signing keys with the same key; set "
            'it (32 random bytes, base64url: python -c "import base64,os; '
            'print(base64.urlsafe_b64encode(os.urandom(32)).decode())").'
        )


def require_shared_key(settings: Settings) -> None:
    """Against a database of its own (DATABASE_URL) a process may not fall back to a key file
    in its data dir: each pod would make its own and could not open the keys the others
    sealed. The embedded default keeps the file (one machine, one data dir)."""
    if settings.database.url and not settings.auth.key_encryption_key:
        raise SharedKeyMissing


def _key_encryption_key(settings: Settings) -> KeyEncryptionKey:
    """The key sealing signing keys; with DATABASE_URL only the shared one (no key file is
    made behind a refusal)."""
    from service.auth.keys import KeyEncryptionKey

    require_shared_key(settings)
    return KeyEncryptionKey.from_setting_or_file(
        settings.auth.key_encryption_key, settings.database.data_dir
    )


@contextmanager
def database_urls(settings: Settings, *, needs_key: bool = True) -> Iterator[DatabaseUrls]:
    """`DATABASE_URL` (the app's login) and `MEMGATE_MIGRATION_DATABASE_URL` (the owner; default
    the same URL) when set, nothing started; otherwise the embedded cluster, where the service
    makes the app's login itself, stopped cleanly on exit if this process started it (a cluster
    another live process started, e.g. a running `serve`, is used and left running).
    `needs_key`: the command opens sealed keys, so DATABASE_URL needs the shared key."""
    database = settings.database
    if needs_key:
        require_shared_key(settings)
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
    # visible: ok cluster admin: creates the database, reads pg_database only
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
    secret_file: Path | None
    """None: the operator supplied the secret (MEMGATE_BOOTSTRAP_ADMIN_SECRET); no file holds it."""

    @property
    def secret_source(self) -> str:
        if self.secret_file is None:
            return "the MEMGATE_BOOTSTRAP_ADMIN_SECRET you supplied (only its hash is stored)"
        return f"in {self.secret_file} (mode 0600)"

    @property
    def secret_shell(self) -> str:
        """The secret as a shell expression, for the banner's curl line."""
        if self.secret_file is None:
            return "$MEMGATE_BOOTSTRAP_ADMIN_SECRET"
        return f"$(cat {self.secret_file})"


async def _bootstrap(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> AdminClient | None:
    """On first start: a default tenant, the platform tenant (its admin is the platform admin),
    with an admin client. Its secret goes to a 0600 file, unless the operator supplied the
    credentials (MEMGATE_BOOTSTRAP_ADMIN_*): then they already hold it, and a data dir that
    dies with a migration Job's pod is no place for it."""
    from service.identity.service import any_tenant, create_tenant

    data_dir = settings.database.data_dir
    supplied = _supplied_admin(settings)
    async with sessionmaker.begin() as session:
        if not await any_tenant(session):
            created = await create_tenant(
                session, "default", platform=True, admin_credentials=supplied
            )
            if supplied is None:
                _write_private(data_dir / ADMIN_SECRET_FILE, created.client_secret + "\n")
            _write_private(
                data_dir / ADMIN_CLIENT_FILE,
                json.dumps(
                    {"tenant_id": str(created.tenant_id), "client_id": str(created.client_id)}
                ),
            )
    return _admin_client(settings)


def _supplied_admin(settings: Settings) -> SuppliedCredentials | None:
    import uuid

    from service.identity.service import SuppliedCredentials

    auth = settings.auth
    if not auth.bootstrap_admin_client_id:
        return None
    return SuppliedCredentials(
        uuid.UUID(auth.bootstrap_admin_client_id), auth.bootstrap_admin_secret
    )


def _admin_client(settings: Settings) -> AdminClient | None:
    """The bootstrap admin client this data dir holds (None: the bootstrap ran elsewhere)."""
    data_dir = settings.database.data_dir
    info_file = data_dir / ADMIN_CLIENT_FILE
    if not info_file.exists():
        return None
    info = json.loads(info_file.read_text())
    written = data_dir / ADMIN_SECRET_FILE
    # The operator supplied it (MEMGATE_BOOTSTRAP_ADMIN_*): it was never written here.
    supplied = bool(settings.auth.bootstrap_admin_client_id) or not written.exists()
    return AdminClient(info["tenant_id"], info["client_id"], None if supplied else written)


async def _bootstrap_as_app(settings: Settings, url: str) -> AdminClient | None:
    """`_bootstrap` on a short-lived engine of the app's login (the parent of workers, and
    `memgate migrate`, hold no runtime)."""
    from service.db.session import create_engine, create_sessionmaker

    engine = create_engine(url, pool_size=1, role=settings.database.app_role)
    try:
        return await _bootstrap(settings, create_sessionmaker(engine))
    finally:
        await engine.dispose()


def _print_banner(
    settings: Settings,
    admin: AdminClient | None,
    started: float,
    workers: int = 1,
    self_signed: SelfSigned | None = None,
) -> None:
    url = settings.server.public_url
    lines = [f"memgate is ready at {url} (started in {time.perf_counter() - started:.1f} s)"]
    if workers > 1:
        lines.append(f"  workers:         {workers} processes on one socket")
    curl = "curl -sS --fail-with-body"
    if self_signed is not None:
        lines += [
            f"  TLS:             self-signed certificate {self_signed.cert_file}",
            f"  SHA-256 fingerprint: {self_signed.fingerprint}",
        ]
        curl += f" --cacert {self_signed.cert_file}"
    elif settings.server.tls_enabled:
        lines.append(f"  TLS:             certificate {settings.server.tls_cert_file}")
    if admin is None:
        lines.append("  bootstrap was done elsewhere; use your admin client's credentials.")
    else:
        lines += [
            f"  tenant:          {admin.tenant_id}",
            f"  admin client id: {admin.client_id}",
            f"  admin secret:    {admin.secret_source}",
            "  get a token:",
            f'    {curl} -X POST {url}/oauth/token -u "{admin.client_id}:'
            f'{admin.secret_shell}" -d grant_type=client_credentials',
            "  or: memgate token",
        ]
    metrics = settings.observability
    if metrics.metrics_port:
        host, first = metrics.metrics_host, metrics.metrics_port
        urls = " ".join(f"http://{host}:{first + i}/metrics" for i in range(workers))
        each = " (one per worker, each counts its own requests)" if workers > 1 else ""
        lines.append(f"  metrics (no token, keep private): {urls}{each}")
    lines.append("  stop with Ctrl-C, SIGTERM or SIGHUP (the embedded database stops with it)")
    print("\n".join(lines), flush=True)


async def _runtime(settings: Settings, url: str, owner_url: str | None) -> Runtime:
    from service.embeddings import create_embedder
    from service.runtime import build_runtime

    return await build_runtime(
        settings, url, create_embedder(settings.embedding), owner_url=owner_url
    )


async def _listen(
    settings: Settings,
    runtime: Runtime,
    on_started: Callable[[], None],
    sock: socket.socket | None = None,
    *,
    worker: bool = False,
) -> None:
    """Serve the app (on `sock` when given, else on MEMGATE_HOST:MEMGATE_PORT) and the metrics
    listener until uvicorn is told to stop; `on_started` runs once it accepts connections.
    A `worker` of `serve --workers N` never force-exits on a second signal (`WorkerServer`)."""
    import uvicorn

    from service.app import create_app
    from service.http.server import MetricsServer, WorkerServer, listener_config
    from service.observability.metrics import create_metrics_app

    observability = settings.observability
    scraping: asyncio.Task[None] | None = None
    metrics = MetricsServer(
        listener_config(
            create_metrics_app(), observability.metrics_host, observability.metrics_port
        )
    )
    try:
        if observability.metrics_port:
            scraping = asyncio.create_task(metrics.serve())
        server = (WorkerServer if worker else uvicorn.Server)(
            listener_config(
                create_app(runtime),
                settings.server.host,
                settings.server.port,
                parser=settings.server.http_parser,
                tls_cert_file=settings.server.tls_cert_file,
                tls_key_file=settings.server.tls_key_file,
            )
        )

        # uvicorn stops gracefully on SIGINT and SIGTERM only; SIGHUP (a closed terminal) gets
        # the same graceful stop instead of killing the process with the database left up.
        # signal.signal, not loop.add_signal_handler: closing the loop would reset SIGHUP to its
        # default while the database is still being stopped.
        def drain(_signum: int, _frame: object) -> None:
            server.should_exit = True

        outer = signal.signal(signal.SIGHUP, drain)
        try:
            serving = asyncio.create_task(server.serve(sockets=None if sock is None else [sock]))
            while not server.started and not serving.done():  # noqa: ASYNC110 (no event)
                await asyncio.sleep(0.05)
            if server.started:
                on_started()
            await serving
        finally:
            signal.signal(signal.SIGHUP, outer)
    finally:
        if scraping is not None:
            metrics.should_exit = True
            await scraping


@dataclass(frozen=True)
class Start:
    """What `serve` found or made before it listens."""

    url: str
    """The app's login."""
    owner_url: str | None
    """The owner's login for the one-time owner work; None: `--no-migrate`, all done already."""
    started: float
    admin: AdminClient | None = None
    """With `owner_url` None: the bootstrap admin this data dir holds (checked by
    `_ready_without_owner`); otherwise found by the bootstrap serve runs."""
    self_signed: SelfSigned | None = None


async def _serve(settings: Settings, start: Start) -> None:
    """One process (`--workers 1`): the runtime, bootstrap, the banner and the listeners."""
    # serve migrates as the owner already, so it also makes missing signing keys as the owner;
    # with --no-migrate it may not, and `_ready_without_owner` checked they exist.
    runtime = await _runtime(settings, start.url, start.owner_url)
    try:
        admin = start.admin
        if start.owner_url is not None:
            admin = await _bootstrap(settings, runtime.sessionmaker)
        await _listen(
            settings,
            runtime,
            lambda: _print_banner(settings, admin, start.started, 1, start.self_signed),
        )
    finally:
        await runtime.close()


def _serve_workers(settings: Settings, start: Start, count: int) -> int:
    """N workers on one socket. The parent makes the keys and the bootstrap admin once (unless
    `--no-migrate`: then they exist already), binds the socket, starts the workers, prints the
    banner once they all accept, and waits; a signal (or one worker's exit) stops them all,
    then the caller stops the embedded database."""
    from service.http.server import bind
    from service.http.workers import Workers, serve_worker, worker_settings

    admin = start.admin
    if start.owner_url is not None:
        if settings.auth.embedded_issuer:
            _provision_keys(settings, start.owner_url)
        _provision_audit_key(settings, start.owner_url)
        admin = asyncio.run(_bootstrap_as_app(settings, start.url))
    try:
        sock = bind(settings.server.host, settings.server.port)
    except OSError as exc:
        where = f"{settings.server.host}:{settings.server.port}"
        print(f"memgate serve: cannot listen on {where}: {exc.strerror}", file=sys.stderr)
        return 1
    workers = Workers(serve_worker, lambda i: (worker_settings(settings, i), start.url), sock)
    try:
        workers.start(count)
        if not workers.wait_ready(WORKER_START_SECONDS):
            print("memgate serve: a worker did not start; stopping.", file=sys.stderr)
            return 1
        _print_banner(settings, admin, start.started, count, start.self_signed)
        exited = workers.wait_for_an_exit()
        # A worker exited unasked (crash, OOM kill): fail the whole serve, so a supervisor
        # (systemd, Kubernetes) restarts it rather than it running on with fewer workers.
        print(
            f"memgate serve: {exited.name} exited ({exited.exitcode}); stopping.", file=sys.stderr
        )
        return 1
    finally:
        # The parent's copy of the socket first: while it is open the kernel keeps queueing
        # new connections that no draining worker accepts, and they hang; once every copy is
        # closed they are refused at once (and a load balancer tries another replica).
        sock.close()
        workers.stop()


def cmd_serve(settings: Settings, workers: int | None = None, migrate: bool | None = None) -> int:
    """`workers`: the `--workers` flag (None: MEMGATE_WORKERS); `migrate`: False for
    `--no-migrate` (None: MEMGATE_MIGRATE)."""
    from service.db.migrate import upgrade
    from service.http.server import run_on_uvloop
    from service.http.tls import check_certificate_files, check_plain_http, with_tls_files
    from service.http.workers import connection_budget, worker_count
    from service.observability.logging import configure_logging
    from service.observability.telemetry import configure_telemetry

    started = time.perf_counter()
    requested = settings.server.workers if workers is None else workers
    migrate = settings.server.migrate if migrate is None else migrate
    check_plain_http(settings.server)  # before anything starts, the database included
    check_certificate_files(settings.server)
    configure_logging(json_logs=settings.server.json_logs)
    code = 0
    with (
        _stopped_by_signals(),
        suppress(KeyboardInterrupt, Stopped),
        database_urls(settings) as urls,
    ):
        settings, self_signed = with_tls_files(settings)
        if migrate:
            upgrade(urls.owner)
            start = Start(urls.app_login(settings), urls.owner, started, self_signed=self_signed)
        else:
            url = urls.existing_app_login()
            admin = _ready_without_owner(settings, url)
            start = Start(url, None, started, admin, self_signed)
        budget = None if requested == 1 else connection_budget(start.owner_url or start.url)
        count = worker_count(
            requested,
            os.cpu_count() or 1,
            settings.database.pool_size,
            budget,
            read_replica=bool(settings.database.read_url),
        )
        if count == 1:
            configure_telemetry(settings.observability)
            run_on_uvloop(_serve(settings, start))
        else:
            code = _serve_workers(settings, start, count)
    return code


class NotMigrated(SystemExit):
    """`serve --no-migrate` found owner work undone (schema, keys, bootstrap)."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"memgate serve --no-migrate: {what}; run `memgate migrate` first (as the owner, "
            "MEMGATE_MIGRATION_DATABASE_URL, with the same MEMGATE_KEY_ENCRYPTION_KEY)."
        )


def _ready_without_owner(settings: Settings, url: str) -> AdminClient | None:
    """`serve --no-migrate` as the app's login alone: refuse to start unless the schema is at
    this code's head and the owner's one-time work is done (signing keys this key-encryption
    key opens, the bootstrap tenant). Returns the bootstrap admin this data dir holds."""
    _check_schema_at_head(settings, url)
    asyncio.run(_check_owner_work_done(settings, url))
    return _admin_client(settings)


def _check_schema_at_head(settings: Settings, url: str) -> None:
    from psycopg import sql

    from service.db.migrate import head_revision

    head = head_revision()
    try:
        # visible: ok reads the schema version only
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(settings.database.app_role)))
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except psycopg.errors.UndefinedTable:
        raise NotMigrated("the database has no memgate schema") from None
    except psycopg.errors.InvalidParameterValue:
        raise NotMigrated(f"the app role {settings.database.app_role} does not exist") from None
    except psycopg.OperationalError as exc:
        reason = (str(exc).strip().splitlines() or ["no reason given"])[-1]
        raise SystemExit(
            f"memgate serve --no-migrate: cannot log in as the app ({reason}); check "
            "DATABASE_URL, or run `memgate migrate` first (it makes the embedded app login)."
        ) from None
    except psycopg.Error as exc:
        # libpq's parse errors quote the part of the URL they stumble on, often the password
        # (an unescaped `%`): name the class only, never the message or the URL.
        raise SystemExit(
            f"memgate serve --no-migrate: DATABASE_URL cannot be used ({type(exc).__name__}); "
            "percent-encode reserved characters in its user and password (% as %25, @ as %40, "
            "/ as %2F, [ as %5B)."
        ) from None
    current = None if row is None else row[0]
    if current != head:
        raise NotMigrated(f"the schema is at {current}, this memgate needs {head}")


async def _check_owner_work_done(settings: Settings, url: str) -> None:
    from service.audit.checkpoints import signing_key
    from service.auth.keys import has_active_key, unopenable_signing_keys
    from service.db.session import create_engine, create_sessionmaker
    from service.identity.service import any_tenant

    kek = _key_encryption_key(settings)
    engine = create_engine(url, pool_size=1, role=settings.database.app_role)
    try:
        async with create_sessionmaker(engine)() as session:
            if settings.auth.embedded_issuer and not await has_active_key(session):
                raise NotMigrated("the embedded issuer has no signing key")
            if settings.auth.embedded_issuer and (
                unopenable := await unopenable_signing_keys(session, kek)
            ):
                raise NotMigrated(
                    f"the {' and '.join(unopenable)} token signing keys cannot be opened with "
                    "this MEMGATE_KEY_ENCRYPTION_KEY"
                )
            if await signing_key(session, kek) is None:
                raise NotMigrated(
                    "there is no audit signing key this MEMGATE_KEY_ENCRYPTION_KEY opens"
                )
            if not await any_tenant(session):
                raise NotMigrated("no tenant was bootstrapped")
    finally:
        await engine.dispose()


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C, so the embedded database is stopped.
    A BaseException, like KeyboardInterrupt: arriving inside code that catches Exception (a
    worker still configuring its logging, which wraps any Exception in a ValueError) it must
    unwind, not become that code's error."""


@contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM (`kill`, systemd, `docker stop`) and SIGHUP end `serve` the way Ctrl-C does.
    Their default action kills the process on the spot, skipping every `finally`, which left the
    embedded PostgreSQL running with no owner. While uvicorn serves it catches SIGTERM itself,
    shuts down gracefully, then raises the signal again: this handler turns that into `Stopped`."""

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _provision_keys(settings: Settings, owner_url: str) -> None:
    """The embedded issuer's first keys, made by the owner: the app role cannot write them."""
    from service.runtime import as_owner, provision_signing_keys

    kek = _key_encryption_key(settings)
    asyncio.run(as_owner(owner_url, lambda s: provision_signing_keys(settings, s, kek)))


def _provision_audit_key(settings: Settings, owner_url: str) -> None:
    """The audit signing key, made by the owner: the app role cannot write audit keys."""
    from service.runtime import as_owner, provision_audit_key

    kek = _key_encryption_key(settings)
    asyncio.run(as_owner(owner_url, lambda s: provision_audit_key(s, kek)))


def cmd_migrate(settings: Settings) -> int:
    """The migration Job's command: the schema to head, then the one-time work `serve
    --no-migrate` may not do (signing keys and audit key as the owner; the app's login on the
    embedded cluster; the bootstrap tenant and admin client, as the app)."""
    from service.db.migrate import upgrade

    with database_urls(settings) as urls:
        upgrade(urls.owner)
        if settings.auth.embedded_issuer:
            _provision_keys(settings, urls.owner)
        _provision_audit_key(settings, urls.owner)
        admin = asyncio.run(_bootstrap_as_app(settings, urls.app_login(settings)))
    print("migrations at head")
    if admin is not None:
        print(
            f"bootstrap admin client {admin.client_id} of tenant {admin.tenant_id}; "
            f"its secret is {admin.secret_source}"
        )
    return 0


def cmd_revision(settings: Settings, message: str) -> int:
    from service.db.migrate import new_revision, upgrade

    with database_urls(settings, needs_key=False) as urls:
        upgrade(urls.owner)
        new_revision(urls.owner, message)
    return 0


def _with_keys(settings: Settings, job: Callable[[Any, Any], Awaitable[T]]) -> T:
    """Run `job(sessionmaker, kek)` against the database as the app role, outside `serve`."""
    from service.db.session import create_engine, create_sessionmaker

    async def run(url: str) -> T:
        engine = create_engine(url, pool_size=1, role=settings.database.app_role)
        kek = _key_encryption_key(settings)
        try:
            return await job(create_sessionmaker(engine), kek)
        finally:
            await engine.dispose()

    with database_urls(settings) as urls:
        return asyncio.run(run(urls.app_login(settings)))


def cmd_rotate_audit_key(settings: Settings) -> int:
    """As the owner, like `keys rotate`: the app role may read audit keys but not write them."""
    from service.runtime import as_owner, rotate_audit_signing_key

    kek = _key_encryption_key(settings)
    with database_urls(settings) as urls:
        kid = asyncio.run(as_owner(urls.owner, lambda s: rotate_audit_signing_key(s, kek)))
    print(f"audit checkpoints are now signed with {kid}")
    return 0


def cmd_rotate_keys(settings: Settings) -> int:
    """As the owner (`MEMGATE_MIGRATION_DATABASE_URL`, else `DATABASE_URL`): the app role may
    read signing keys but not write them."""
    from service.runtime import as_owner, rotate_signing_keys

    kek = _key_encryption_key(settings)
    with database_urls(settings) as urls:
        kid = asyncio.run(
            as_owner(urls.owner, lambda sessions: rotate_signing_keys(settings, sessions, kek))
        )
    print(f"active signing key is now {kid}")
    return 0


def cmd_audit_checkpoint(settings: Settings) -> int:
    """For a CronJob (with MEMGATE_AUDIT_CHECKPOINT_SECONDS=0 on the API pods)."""
    from service.audit.checkpoints import NoAuditKey, run_checkpoints

    try:
        made = _with_keys(settings, run_checkpoints)
    except NoAuditKey:
        print(
            "memgate audit checkpoint: no audit signing key this key-encryption key opens; run "
            "`memgate migrate` (as the owner, MEMGATE_MIGRATION_DATABASE_URL) to make one.",
            file=sys.stderr,
        )
        return 1
    print(f"signed {made} audit checkpoint(s)")
    return 0


def _local_url(settings: Settings) -> str:
    """This machine's own listener: loopback when serve binds every address."""
    server = settings.server
    scheme = "https" if server.tls_enabled else "http"
    host = server.host.strip("[]")
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 (compared, not bound)
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{server.port}"


def cmd_healthcheck(settings: Settings) -> int:
    """Liveness of the server on this machine (the image's HEALTHCHECK): its certificate names
    the public host, not the address probed here, so it is not verified; nothing is sent but
    the probe, and the answer's body is not trusted for anything."""
    import httpx

    url = f"{_local_url(settings)}/healthz"
    try:
        answer = httpx.get(url, timeout=5, verify=False)  # noqa: S501 (liveness probe of our own socket)
    except httpx.HTTPError as exc:
        print(f"memgate healthcheck: {url}: {exc.__class__.__name__}", file=sys.stderr)
        return 1
    if answer.status_code != 200:
        print(f"memgate healthcheck: {url} answered {answer.status_code}", file=sys.stderr)
        return 1
    return 0


def _token_verify(settings: Settings) -> ssl.SSLContext | bool:
    """How `memgate token` checks the server: against the self-signed certificate of this data
    dir when serve made one, else the system's trust (SSL_CERT_FILE names another bundle)."""
    from service.http.tls import CERT_FILE, TLS_DIR

    cert_file = settings.database.data_dir / TLS_DIR / CERT_FILE
    if settings.server.tls == "self-signed" and cert_file.exists():
        return ssl.create_default_context(cafile=str(cert_file))
    return True


def cmd_token(settings: Settings, scopes: list[str] | None) -> int:
    """Failures are one line on stderr naming what to fix; no traceback."""
    import httpx

    credentials = _platform_operator(settings, "token")
    if credentials is None:
        return 1
    client_id, secret = credentials
    form = {"grant_type": "client_credentials"}
    if scopes:
        form["scope"] = " ".join(scopes)
    url = f"{settings.server.public_url}/oauth/token"
    try:
        response = httpx.post(
            url, data=form, auth=(client_id, secret), timeout=10, verify=_token_verify(settings)
        )
    except httpx.HTTPError as exc:
        print(
            f"memgate token: cannot reach {url} ({exc.__class__.__name__}); is memgate serve "
            "running there? (MEMGATE_PUBLIC_URL, or MEMGATE_HOST/MEMGATE_PORT, name it)",
            file=sys.stderr,
        )
        return 1
    if response.is_error:
        print(
            f"memgate token: {url} answered {response.status_code}: {response.text}",
            file=sys.stderr,
        )
        return 1
    print(response.json()["access_token"])
    return 0


def _transfer_server(settings: Settings, args: argparse.Namespace, command: str) -> Any:
    """The server `memgate import|export` talks to, and whose client it authenticates as:
    --client-id/--client-secret-file, else MEMGATE_CLIENT_ID/MEMGATE_CLIENT_SECRET, else the
    bootstrap admin of MEMGATE_DATA_DIR (as `memgate token`)."""
    from service.transfer.client import Credentials, Server, TransferFailed

    client_id = args.client_id or os.environ.get("MEMGATE_CLIENT_ID")
    if args.client_secret_file:
        secret = Path(args.client_secret_file).read_text().strip()
    else:
        secret = os.environ.get("MEMGATE_CLIENT_SECRET", "")
    if not client_id or not secret:
        data_dir = settings.database.data_dir
        try:
            info = json.loads((data_dir / ADMIN_CLIENT_FILE).read_text())
            client_id = str(info["client_id"])
            secret = (data_dir / ADMIN_SECRET_FILE).read_text().strip()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TransferFailed(
                f"no client to authenticate as: give --client-id and --client-secret-file (or "
                "MEMGATE_CLIENT_ID and MEMGATE_CLIENT_SECRET), or run it beside the server's "
                f"MEMGATE_DATA_DIR for its bootstrap admin ({exc.__class__.__name__})"
            ) from None
    return Server(args.url or settings.server.public_url, Credentials(client_id, secret))


def cmd_transfer(settings: Settings, args: argparse.Namespace) -> int:
    """`memgate import FILE` / `memgate export FILE`; failures are one line on stderr."""
    from service.transfer.client import TransferFailed
    from service.transfer.run import ExportRun, ImportRun

    path = Path(args.file)
    state = Path(args.state) if args.state else path.with_name(path.name + ".state")
    try:
        with _transfer_server(settings, args, args.command) as server:
            if args.command == "import":
                done = ImportRun(
                    server,
                    path,
                    args.format,
                    state,
                    space_id=args.space,
                    batch_size=args.batch_size,
                    skip_invalid=args.skip_invalid,
                ).run()
            else:
                done = ExportRun(server, path, state, space_id=args.space).run()
    except (TransferFailed, OSError) as exc:
        print(f"memgate {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # anything else is one line too, never a traceback
        said = str(exc).splitlines()[0][:300] if str(exc) else ""
        print(f"memgate {args.command}: failed: {exc.__class__.__name__}: {said}", file=sys.stderr)
        return 1
    print(json.dumps(done))
    return 0


def _platform_operator(settings: Settings, command: str) -> tuple[str, str] | None:
    """The bootstrap admin's client id and secret (the platform admin): the ones the operator
    supplied (MEMGATE_BOOTSTRAP_ADMIN_*), else from MEMGATE_DATA_DIR."""
    auth = settings.auth
    if auth.bootstrap_admin_client_id:
        return auth.bootstrap_admin_client_id, auth.bootstrap_admin_secret
    data_dir = settings.database.data_dir
    info_file, secret_file = data_dir / ADMIN_CLIENT_FILE, data_dir / ADMIN_SECRET_FILE
    try:
        info = json.loads(info_file.read_text())
        return str(info["client_id"]), secret_file.read_text().strip()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"memgate {command}: cannot read the platform admin client ({info_file}, "
            f"{secret_file}): {exc.__class__.__name__}. Run `memgate serve` once with this "
            "MEMGATE_DATA_DIR (its first start writes them), or set MEMGATE_DATA_DIR to the "
            "server's data dir.",
            file=sys.stderr,
        )
        return None


def cmd_tenants(settings: Settings, action: str, argument: str | None) -> int:
    """`memgate tenants create NAME | list | disable ID | enable ID`, as the platform admin,
    against the database (a running serve's embedded cluster is used and left running)."""
    import msgspec

    from service.problems import Problem
    from service.tenants.cli import Operator, OperatorRefused, run

    credentials = _platform_operator(settings, "tenants")
    if credentials is None:
        return 1

    async def act(url: str) -> Any:
        runtime = await _runtime(settings, url, None)
        try:
            return await run(runtime, Operator(*credentials), action, argument)
        finally:
            await runtime.close()

    try:
        with database_urls(settings) as urls:
            result = asyncio.run(act(urls.app_login(settings)))
    except OperatorRefused as exc:
        print(f"memgate tenants: {exc}", file=sys.stderr)
        return 1
    except Problem as problem:
        print(f"memgate tenants {action}: {problem.slug}: {problem.detail}", file=sys.stderr)
        return 1
    if action == "create":
        result = _created_tenant(settings, msgspec.to_builtins(result))
    elif action == "list":
        result = {"items": msgspec.to_builtins(result)}
    print(json.dumps(msgspec.to_builtins(result), indent=2))
    return 0


def _created_tenant(settings: Settings, created: dict[str, Any]) -> dict[str, Any]:
    """The new tenant's admin secret goes to a 0600 file beside the bootstrap admin's, never to
    the terminal (scrollback, logs of a CI job); the answer names the file."""
    tenant_id, admin = created["tenant"]["tenant_id"], created["admin"]
    secret_file = settings.database.data_dir / "tenants" / f"{tenant_id}.admin-client.secret"
    _write_private(secret_file, admin.pop("client_secret") + "\n")
    admin["client_secret_file"] = str(secret_file)
    return created


def cmd_erasure(settings: Settings, args: argparse.Namespace) -> int:
    """`memgate erasure plan | execute ID --version N | proof ID`: a client of the running
    server (its public URL), with the bearer token in MEMGATE_TOKEN. The answer as JSON on
    stdout; a refusal is one line on stderr (its problem type and detail), exit code 1."""
    import httpx

    from service.erasure import cli

    token = os.environ.get("MEMGATE_TOKEN", "").strip()
    if not token:
        print(
            "memgate erasure: set MEMGATE_TOKEN to a token holding manage:erasure (`memgate "
            "token --scope manage:erasure` for the bootstrap admin, once it holds the eraser "
            "role: PUT /v1/principals/{id}/roles/eraser)",
            file=sys.stderr,
        )
        return 2

    async def act() -> Any:
        async with httpx.AsyncClient(
            base_url=settings.server.public_url, timeout=600, verify=_token_verify(settings)
        ) as http:
            if args.erasure_command == "plan":
                arguments = cli.PlanArguments(
                    subjects=args.subject,
                    owners=args.owner,
                    memory_ids=args.memory,
                    names=args.name,
                    reason=args.reason,
                    keep_tombstones=not args.no_tombstones,
                    rewrite=not args.no_rewrite,
                )
                return await cli.plan(http, token, arguments)
            if args.erasure_command == "execute":
                return await cli.execute(http, token, args.erasure_id, args.version)
            return await cli.proof(http, token, args.erasure_id)

    try:
        result = asyncio.run(act())
    except cli.Refused as exc:
        print(f"memgate erasure {args.erasure_command}: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(
            f"memgate erasure: cannot reach {settings.server.public_url} "
            f"({exc.__class__.__name__}); is memgate serve running there?",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(result, indent=2))
    return 0


def cmd_jobs_run(
    settings: Settings, name: str, tenant: str | None, space: str | None, dry_run: bool
) -> int:
    """`memgate jobs run NAME`: against the database (a running serve's embedded cluster is used
    and left running); what a Kubernetes CronJob runs. Progress on stderr, the runs on stdout."""
    import uuid

    from service.jobs.cli import JobRefused, run
    from service.observability.logging import configure_logging
    from service.problems import Problem

    # The runner logs each batch: on stderr with the progress, so stdout stays the JSON answer.
    configure_logging(json_logs=settings.server.json_logs, stream=sys.stderr)
    try:
        tenant_id = uuid.UUID(tenant) if tenant else None
        space_id = uuid.UUID(space) if space else None
    except ValueError:
        print("memgate jobs run: --tenant and --space take ids (UUIDs)", file=sys.stderr)
        return 2

    async def act(url: str, owner_url: str) -> Any:
        runtime = await _runtime(settings, url, None)
        try:
            return await run(runtime, name, tenant_id, space_id, dry_run, owner_url)
        finally:
            await runtime.close()

    try:
        with database_urls(settings) as urls:
            result = asyncio.run(act(urls.app_login(settings), urls.owner))
    except JobRefused as exc:
        print(f"memgate jobs run: {exc}", file=sys.stderr)
        return 1
    except Problem as problem:
        print(f"memgate jobs run {name}: {problem.slug}: {problem.detail}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str))
    ended = [r["status"] for r in result.get("runs", [])]
    return 0 if all(status == "finished" for status in ended) else 1


def cmd_openapi(path: Path, markdown: Path | None) -> int:
    import yaml

    from service.http.openapi_doc import api_reference, render_openapi

    rendered = render_openapi()
    path.write_text(rendered)
    print(f"wrote {path}")
    if markdown is not None:
        markdown.write_text(api_reference(yaml.safe_load(rendered)))
        print(f"wrote {markdown}")
    return 0


def _worker_flag(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a worker count (0 or more): {raw!r}")
    return value


def _erasure_commands(commands: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """`memgate erasure plan | execute | proof` (service/erasure/cli.py)."""
    erasure = command(
        commands,
        "erasure",
        "plan, execute and prove an erasure (docs/erasure.md)",
        "A client of the running server: the token in MEMGATE_TOKEN must hold manage:erasure "
        "for a principal with the eraser role.",
    )
    erasure_commands = erasure.add_subparsers(
        dest="erasure_command", required=True, metavar="ACTION"
    )
    planning = command(erasure_commands, "plan", "plan an erasure (a dry run, JSON)")
    for flag, dest, what in (
        ("--subject", "subject", "erase every memory filed under this subject"),
        ("--owner", "owner", "erase every memory this principal wrote (its id)"),
        ("--memory", "memory", "erase this memory (its id)"),
        ("--name", "name", "a name or alias for the mention review list"),
    ):
        planning.add_argument(flag, dest=dest, action="append", default=[], help=f"{what}; repeat")
    planning.add_argument("--reason", required=True, help="why (no names, no content)")
    planning.add_argument(
        "--no-tombstones", action="store_true", help="let the same text be written again"
    )
    planning.add_argument(
        "--no-rewrite", action="store_true", help="plain VACUUM instead of VACUUM FULL"
    )
    executing = command(erasure_commands, "execute", "execute a plan; print its receipt")
    executing.add_argument("erasure_id", help="the plan's id")
    executing.add_argument("--version", type=int, required=True, help="the plan's version")
    proving = command(erasure_commands, "proof", "check an erasure; print the proof")
    proving.add_argument("erasure_id", help="the plan's id")


def _transfer_commands(commands: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """`memgate import FILE` and `memgate export FILE` (service/transfer/)."""
    from service.transfer.formats import FORMATS

    for verb, summary, details in (
        (
            "import",
            "import memories from a JSONL file into a running server",
            "Sends batches of POST /v1/memories:batch, each under an Idempotency-Key, printing "
            "progress on stderr. Resumable: after an interruption run the same command again "
            "(the state file says where it stopped). docs/import-export.md has the formats.",
        ),
        (
            "export",
            "export the memories you may read from a running server to a JSONL file",
            "Pages GET /v1/memories into the memgate import format; resumable like import.",
        ),
    ):
        transfer = command(commands, verb, summary, details)
        transfer.add_argument("file", help="the JSONL file")
        transfer.add_argument("--space", help="the space to write into / to export (its id)")
        transfer.add_argument(
            "--state", help="the state file (default: FILE.state next to the file)"
        )
        transfer.add_argument("--url", help="the server (default MEMGATE_PUBLIC_URL)")
        transfer.add_argument("--client-id", help="default MEMGATE_CLIENT_ID, else the admin")
        transfer.add_argument(
            "--client-secret-file", help="a file holding the client's secret (else env)"
        )
        if verb == "import":
            transfer.add_argument(
                "--format",
                choices=FORMATS,
                default="memgate",
                help="the file's shape: memgate (what export writes), mem0 or zep exports",
            )
            transfer.add_argument(
                "--batch-size",
                type=int,
                default=500,
                help="memories per batch (at most the server's MEMGATE_BATCH_MAX_ITEMS)",
            )
            transfer.add_argument(
                "--skip-invalid",
                action="store_true",
                help="leave out records the server refuses (listed on stderr) instead of stopping",
            )


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    parser = argparse.ArgumentParser(
        prog="memgate",
        description="memgate: a multi-tenant memory service for AI agents. Settings are "
        "environment variables (service/settings.py); without DATABASE_URL every command uses "
        "the embedded PostgreSQL under MEMGATE_DATA_DIR, and leaves it running when another "
        "memgate process (a running serve) started it.",
    )
    parser.add_argument("--version", action="version", version=f"memgate {version('memgate')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(where: Any, name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = where.add_parser(
            name, help=summary, description=f"{summary}. {details}".strip()
        )
        return sub

    serve = command(
        commands,
        "serve",
        "start memgate (embedded database unless DATABASE_URL)",
        "Migrates to head, bootstraps a default tenant and admin client on first start, and "
        "serves on MEMGATE_HOST:MEMGATE_PORT (HTTPS with MEMGATE_TLS_CERT_FILE/KEY_FILE or "
        "MEMGATE_TLS=self-signed; plain HTTP on loopback only unless MEMGATE_ALLOW_PLAIN_HTTP). "
        "Ctrl-C, SIGTERM or SIGHUP stop it and the embedded database it started.",
    )
    serve.add_argument(
        "--no-migrate",
        dest="migrate",
        action="store_false",
        default=None,
        help="do not migrate (MEMGATE_MIGRATE=0): run as the app's login (DATABASE_URL) alone, "
        "and refuse to start unless `memgate migrate` brought the schema to head and made the "
        "keys and the bootstrap tenant; what API pods run after the migration Job",
    )
    serve.add_argument(
        "--workers",
        type=_worker_flag,
        metavar="N",
        help="worker processes on the one socket (default MEMGATE_WORKERS, else 0: one per "
        "core, as many as the database's connections allow); 1: a single process",
    )
    command(
        commands,
        "migrate",
        "run database migrations to head",
        "As the owner (MEMGATE_MIGRATION_DATABASE_URL, else DATABASE_URL); also makes the "
        "signing keys and the audit key, and bootstraps the first tenant and admin client: "
        "the migration Job's command, before `serve --no-migrate` pods.",
    )
    command(
        commands,
        "healthcheck",
        "exit 0 when the local server answers /healthz (the container's HEALTHCHECK)",
    )
    revision = command(commands, "revision", "autogenerate a migration from the models")
    revision.add_argument("-m", "--message", required=True, help="the migration's title")
    keys = command(
        commands,
        "keys",
        "signing keys of the embedded issuer",
        "`memgate keys rotate` promotes the published next key; tokens signed by the old one "
        "keep verifying until they expire. `memgate keys rotate-audit` retires the audit "
        "signing key and makes a new one; checkpoints the old one signed keep verifying.",
    )
    keys.add_argument(
        "action",
        choices=["rotate", "rotate-audit"],
        help="rotate: rotate the token signing keys; rotate-audit: the audit signing key",
    )
    token = command(
        commands,
        "token",
        "print an access token for the bootstrap admin",
        "Reads the admin client from MEMGATE_DATA_DIR and asks the server at MEMGATE_PUBLIC_URL.",
    )
    token.add_argument(
        "--scope",
        action="append",
        metavar="SCOPE",
        help="a scope to ask for (repeat, or give several separated by spaces); default: all "
        "the client's scopes",
    )
    audit = command(commands, "audit", "the audit log: verify an export, sign checkpoints")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    verify = command(
        audit_commands,
        "verify",
        "check an export of GET /v1/audit/export (no database needed)",
        "Exit code 0 when the chain (and the checkpoint's signature, if given) holds.",
    )
    verify.add_argument("export", help="NDJSON file from GET /v1/audit/export")
    verify.add_argument("--checkpoint", help="JSON from GET /v1/audit/checkpoints/latest")
    verify.add_argument("--keys", help="JWKS from GET /v1/audit/keys")
    verify.add_argument(
        "--head", help="SEQ:HASH of a head you hold (an Audit-Receipt); finds a cut tail"
    )
    command(
        audit_commands,
        "checkpoint",
        "sign a checkpoint for every tenant whose audit chain grew",
        "For a CronJob (with MEMGATE_AUDIT_CHECKPOINT_SECONDS=0 on the API pods).",
    )
    tenants = command(
        commands,
        "tenants",
        "manage tenants as the platform admin",
        "Acts as the bootstrap admin of MEMGATE_DATA_DIR (the platform admin) directly on the "
        "database, audited like the API; works while `memgate serve` runs. `create NAME` "
        "writes the new tenant's admin secret to a 0600 file and prints its path.",
    )
    tenant_commands = tenants.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    create = command(tenant_commands, "create", "create a tenant and its first admin client")
    create.add_argument("name", help="the tenant's name")
    command(tenant_commands, "list", "list the tenants (JSON)")
    for verb in ("disable", "enable"):
        toggled = command(tenant_commands, verb, f"{verb} a tenant (idempotent)")
        toggled.add_argument("tenant_id", help="the tenant's id")
    _erasure_commands(commands, command)
    jobs = command(
        commands,
        "jobs",
        "run the jobs that keep memory tidy (docs/jobs.md)",
        "Works on the database directly, like `memgate tenants` (a running serve's embedded "
        "cluster is used and left running); a Kubernetes CronJob runs `memgate jobs run NAME`.",
    )
    job_commands = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    job_run = command(
        job_commands,
        "run",
        "run a job now, batch by batch, printing progress and the counts",
        "Tenant jobs (memory.sweep_expired ...) run in every enabled tenant unless --tenant "
        "names one, as the tenant's job principal; platform jobs (audit.checkpoint, "
        "keys.rotate) once. Exit code 0 when every run finished.",
    )
    job_run.add_argument("name", help="the job's name, e.g. memory.sweep_expired")
    job_run.add_argument("--tenant", help="only this tenant (its id)")
    job_run.add_argument("--space", help="only this space (its id)")
    job_run.add_argument(
        "--dry-run", action="store_true", help="count what the job would do; change nothing"
    )
    _transfer_commands(commands, command)
    openapi = command(commands, "openapi", "write the OpenAPI document")
    openapi.add_argument(
        "--output", type=Path, default=Path("openapi.yaml"), help="where (default openapi.yaml)"
    )
    openapi.add_argument(
        "--markdown",
        type=Path,
        metavar="PATH",
        help="also write the API reference in Markdown there (docs/api.md)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"memgate: {exc}", file=sys.stderr)
        return 2
    from service.auth.keys import WrongKeyEncryptionKey

    try:
        return _COMMANDS[args.command](settings, args)
    except WrongKeyEncryptionKey as exc:
        print(f"memgate {args.command}: {exc}", file=sys.stderr)
        return 1


def _keys(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "rotate-audit":
        return cmd_rotate_audit_key(settings)
    return cmd_rotate_keys(settings)


def _audit(settings: Settings, args: argparse.Namespace) -> int:
    if args.audit_command == "verify":
        from service.audit.independent import run

        return run(args.export, args.checkpoint, args.keys, args.head)
    return cmd_audit_checkpoint(settings)


def _tenants(settings: Settings, args: argparse.Namespace) -> int:
    argument = getattr(args, "name", None) or getattr(args, "tenant_id", None)
    return cmd_tenants(settings, args.tenant_command, argument)


_COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "serve": lambda settings, args: cmd_serve(settings, args.workers, args.migrate),
    "healthcheck": lambda settings, _: cmd_healthcheck(settings),
    "migrate": lambda settings, _: cmd_migrate(settings),
    "revision": lambda settings, args: cmd_revision(settings, args.message),
    "keys": _keys,
    "audit": _audit,
    "token": lambda settings, args: cmd_token(settings, args.scope),
    "tenants": _tenants,
    "import": cmd_transfer,
    "export": cmd_transfer,
    "erasure": cmd_erasure,
    "jobs": lambda settings, args: cmd_jobs_run(
        settings, args.name, args.tenant, args.space, args.dry_run
    ),
    "openapi": lambda _, args: cmd_openapi(args.output, args.markdown),
}
"""Each `memgate` command: what it runs with the settings and its parsed arguments."""

if __name__ == "__main__":
    sys.exit(main())
