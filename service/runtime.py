"""Everything a running app holds: settings, database, embedder, token verifier, issuer keys.

Built once at startup (`build_runtime`) and injected; tests build one per database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from service.audit.checkpoints import ensure_audit_key, rotate_audit_key, signing_key
from service.audit.group_commit import GROUP_COMMIT_POOL_SIZE, ReadAuditQueue
from service.audit.pseudonyms import Pseudonyms
from service.auth.issuer import IssuerConfig
from service.auth.keys import (
    KeyEncryptionKey,
    ensure_keys,
    has_active_key,
    published_jwks,
    rotate,
)
from service.auth.throttle import TokenGate
from service.auth.tokens import CachedKeySet, TokenVerifier, TrustedIssuer, http_jwks_fetcher
from service.db.models import EMBEDDING_DIMENSIONS
from service.db.replica import (
    CONNECT_TIMEOUT_SECONDS,
    REPLICA_SAMPLER_CONNECTIONS,
    ReadReplica,
)
from service.db.roles import login_problems
from service.db.session import create_engine, create_sessionmaker
from service.embeddings import Embedder, EmbeddingFailed, EmbeddingInvalid, traced_embedder
from service.erasure.files import Maintenance
from service.issuers.directory import TenantIssuerDirectory
from service.memory.recalls import RecallLog
from service.observability.telemetry import instrument_engine
from service.quotas.limiter import QUOTA_CONNECTIONS, Quotas
from service.settings import Settings
from service.shredding import Vault, key_store_from

T = TypeVar("T")
EMBEDDED_KEYS_TTL_SECONDS = 60.0
JWKS_CACHE_SECONDS = 600
PLATFORM_AUDIT_SLOTS = 2
"""One chain, one lock: a second slot overlaps one row's round trips with the next's lock wait."""
"""How long other verifiers may cache our JWKS (the `/.well-known/jwks.json` max-age is less)."""


@dataclass
class Runtime:
    settings: Settings
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    embedder: Embedder
    verifier: TokenVerifier
    kek: KeyEncryptionKey
    issuer: IssuerConfig
    embedded_keys: CachedKeySet
    pseudonyms: Pseudonyms
    login_problems: list[str]
    """Why the database login could leave the app role; `/readyz` fails while there are any."""
    token_gate: TokenGate
    """Admission to `/oauth/token` (in-flight bound, failed-authentication limits)."""
    read_audit: ReadAuditQueue
    """Where read calls' audit rows are group-committed (service/audit/group_commit.py), on a
    connection of their own: readers wait for it holding theirs, so it must not queue behind
    them in the call pool."""
    quotas: Quotas
    """Tenant and client limits and this replica's share of their state (service/quotas), on
    connections of its own for the same reason."""
    recalls: RecallLog
    """The ids searches and gets answered, written in batches by a background task
    (service/memory/recalls.py): what `memory.age_unused` reads."""
    platform_audit_slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(PLATFORM_AUDIT_SLOTS)
    )
    """Connections the audit rows of unauthenticated calls may hold at once (service/calls.py)."""
    maintenance: Maintenance | None = None
    """How an erasure VACUUMs and scans the database files (service/erasure/files.py)."""
    replica: ReadReplica | None = None
    """The read replica read-only calls run on when it is fresh enough (service/db/replica.py),
    or None (`MEMGATE_READ_DATABASE_URL` empty)."""
    vault: Vault | None = None
    """Seals and opens crypto-shredding tenants' memory text (service/shredding); every session
    of this runtime carries it (`vault_of(session)`)."""

    async def close(self) -> None:
        await self.recalls.close()  # before the pool goes: the last recalls are written
        await self.read_audit.close()
        await self.quotas.close()
        if self.replica is not None:
            await self.replica.close()
        await self.engine.dispose()

    async def rotate_signing_keys(self, owner_url: str) -> str:
        """Rotate the embedded issuer's keys as the owner (`owner_url`: the app role may not
        write them); this process sees the new key at once."""
        kid = await as_owner(
            owner_url, lambda sessions: rotate_signing_keys(self.settings, sessions, self.kek)
        )
        self.embedded_keys.invalidate()
        return kid


async def as_owner(
    owner_url: str, job: Callable[[async_sessionmaker[AsyncSession]], Awaitable[T]]
) -> T:
    """Run `job` on a short-lived engine logged in as the tables' owner (no `SET ROLE`): for
    the few writes the app role may not make, such as token signing keys (review item 5)."""
    engine = create_engine(owner_url, pool_size=1)
    try:
        return await job(create_sessionmaker(engine))
    finally:
        await engine.dispose()


async def provision_signing_keys(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey
) -> None:
    """As the owner: an `active` and a `next` key exist (first start, or after cleanup)."""
    async with sessionmaker.begin() as session:
        await ensure_keys(session, settings.auth.signing_alg, kek)


async def provision_audit_key(
    sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey
) -> None:
    """As the owner: an audit signing key this key-encryption key opens exists. The app role
    may not write audit keys (a key it planted was trusted), so it cannot make its own."""
    async with sessionmaker.begin() as session:
        await ensure_audit_key(session, kek)


async def rotate_audit_signing_key(
    sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey
) -> str:
    """`memgate keys rotate-audit`, on an owner's `sessionmaker`; returns the new kid."""
    async with sessionmaker.begin() as session:
        return await rotate_audit_key(session, kek)


async def rotate_signing_keys(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey
) -> str:
    """One rotation (also `memgate keys rotate`), on an owner's `sessionmaker`: the app role
    cannot write `signing_keys`, so a stolen app login cannot plant a key of its own. Retired
    keys are kept for the longest token lifetime plus the JWKS cache time plus leeway, so every
    token they signed still verifies."""
    auth = settings.auth
    keep = timedelta(seconds=auth.max_token_ttl_seconds + JWKS_CACHE_SECONDS + auth.leeway_seconds)
    async with sessionmaker.begin() as session:
        return await rotate(session, auth.signing_alg, kek, keep)


async def check_embedder(embedder: Embedder) -> None:
    """Refuse to start unless the model's vectors fit the schema: the configured dimension, and
    one real embedding (an HTTP provider may serve another model than configured)."""
    if embedder.dimensions != EMBEDDING_DIMENSIONS:
        raise SystemExit(
            f"The embedding model {embedder.model_id} has {embedder.dimensions} dimensions but "
            f"the schema stores {EMBEDDING_DIMENSIONS}; refusing to start."
        )
    try:
        await embedder.embed(["memgate start-up probe"])
    except (EmbeddingInvalid, EmbeddingFailed) as exc:
        raise SystemExit(
            f"The embedding provider {embedder.model_id} failed its start-up probe: "
            f"{exc.detail} Refusing to start."
        ) from None


async def build_runtime(
    settings: Settings, database_url: str, embedder: Embedder, *, owner_url: str | None = None
) -> Runtime:
    """The runtime on the app's login `database_url`. With `owner_url` (the embedded service,
    which migrates as the owner anyway, and tests) missing signing keys are made as the owner;
    without it they must exist already (`memgate migrate` makes them)."""
    await check_embedder(embedder)
    engine = create_engine(
        database_url,
        pool_size=settings.database.pool_size,
        role=settings.database.app_role,
        prepared=settings.database.prepared_statements,
        statement_timeout_ms=settings.database.statement_timeout_ms,
    )
    instrument_engine(engine)
    sessionmaker = create_sessionmaker(engine)
    kek = KeyEncryptionKey.from_setting_or_file(
        settings.auth.key_encryption_key, settings.database.data_dir
    )

    async def embedded_jwks() -> dict[str, object]:
        async with sessionmaker() as session:
            return await published_jwks(session)

    embedded_keys = CachedKeySet(
        embedded_jwks, ttl=EMBEDDED_KEYS_TTL_SECONDS, min_refetch=settings.auth.jwks_refetch_seconds
    )
    if owner_url is not None:
        await as_owner(owner_url, lambda sessions: provision_audit_key(sessions, kek))
    issuers: list[TrustedIssuer] = []
    issuer_config = IssuerConfig(
        issuer=settings.server.public_url,
        audience=settings.auth.audience,
        ttl_seconds=settings.auth.token_ttl_seconds,
    )
    if settings.auth.embedded_issuer:
        issuers.append(
            TrustedIssuer(
                issuer=issuer_config.issuer,
                audience=settings.auth.audience,
                algorithms=(settings.auth.signing_alg,),
                keys=embedded_keys,
                embedded=True,
            )
        )
        if owner_url is not None:
            await as_owner(
                owner_url, lambda sessions: provision_signing_keys(settings, sessions, kek)
            )
        async with sessionmaker() as session:
            if not await has_active_key(session):
                raise SystemExit(
                    "The embedded issuer has no active signing key, and the app's database "
                    "login may not make one. Run `memgate migrate` (with the owner's "
                    "MEMGATE_MIGRATION_DATABASE_URL) to create the keys, then start again."
                )
    for external in settings.auth.external_issuers:
        issuers.append(
            TrustedIssuer(
                issuer=external.issuer,
                audience=external.audience,
                algorithms=external.algorithms,
                keys=CachedKeySet(
                    http_jwks_fetcher(external.jwks_url),
                    min_refetch=settings.auth.jwks_refetch_seconds,
                ),
                require_typ=external.require_typ,
                require_jti=False,
                tenant_claim=external.tenant_claim,
                subject_claim=external.subject_claim,
                scope_claim=external.scope_claim,
                client_id_claim=external.client_id_claim,
            )
        )
    tenant_issuers = TenantIssuerDirectory(
        sessionmaker,
        cache_seconds=settings.auth.tenant_issuer_cache_seconds,
        jwks_timeout=settings.auth.tenant_jwks_timeout_seconds,
        allow_loopback=settings.auth.tenant_issuers_allow_loopback,
        min_refetch=settings.auth.jwks_refetch_seconds,
    )
    verifier = TokenVerifier(
        issuers,
        leeway=settings.auth.leeway_seconds,
        max_ttl=settings.auth.max_token_ttl_seconds,
        directory=tenant_issuers,
    )
    async with sessionmaker() as session:
        if await signing_key(session, kek) is None:
            # Calls still work; checkpoints wait until the owner makes a key.
            structlog.get_logger("memgate.startup").error(
                "audit_signing_key_missing",
                fix="run `memgate migrate` (with the owner's MEMGATE_MIGRATION_DATABASE_URL) "
                "to make the audit signing key; until then no checkpoint is signed",
            )
    replica = _read_replica(settings, database_url)
    vault = Vault(key_store_from(settings), kek, on_kubernetes=settings.shredding.on_kubernetes)
    for sessions in (sessionmaker, None if replica is None else replica.sessionmaker):
        if sessions is not None:
            sessions.configure(info={"vault": vault})
    return Runtime(
        vault=vault,
        replica=replica,
        maintenance=Maintenance(owner_url=owner_url, app_url=database_url),
        settings=settings,
        engine=engine,
        sessionmaker=sessionmaker,
        embedder=traced_embedder(embedder),
        verifier=verifier,
        kek=kek,
        issuer=issuer_config,
        embedded_keys=embedded_keys,
        pseudonyms=Pseudonyms(kek),
        login_problems=await _checked_login(engine),
        read_audit=ReadAuditQueue(
            create_engine(
                database_url,
                pool_size=GROUP_COMMIT_POOL_SIZE,
                role=settings.database.app_role,
                prepared=settings.database.prepared_statements,
                statement_timeout_ms=settings.database.statement_timeout_ms,
            )
        ),
        quotas=Quotas(
            create_engine(
                database_url,
                pool_size=QUOTA_CONNECTIONS,
                max_overflow=0,
                role=settings.database.app_role,
                prepared=settings.database.prepared_statements,
                statement_timeout_ms=settings.database.statement_timeout_ms,
            ),
            settings.quotas,
        ),
        recalls=RecallLog(sessionmaker, settings.recalls),
        token_gate=TokenGate(
            max_in_flight=settings.auth.token_max_in_flight,
            max_in_flight_per_source=settings.auth.token_max_in_flight_per_source,
            max_in_flight_per_client=settings.auth.token_max_in_flight_per_client,
            failure_burst=settings.auth.token_failure_burst,
            failures_per_minute=settings.auth.token_failures_per_minute,
        ),
    )


def _read_replica(settings: Settings, database_url: str) -> ReadReplica | None:
    """The replica's pool (the same app role and `SET ROLE` as the primary's, so row-level
    security names callers the same way) and its sampler's one connection to the primary."""
    database = settings.database
    if not database.read_url:
        return None
    engine = create_engine(
        database.read_url,
        pool_size=database.pool_size,
        role=database.app_role,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        prepared=database.prepared_statements,
        statement_timeout_ms=database.statement_timeout_ms,
    )
    instrument_engine(engine)
    probe = create_engine(database_url, pool_size=REPLICA_SAMPLER_CONNECTIONS, max_overflow=0)
    replica = ReadReplica(engine, probe, database.read_replica_max_lag)
    replica.start()
    return replica


async def _checked_login(engine: AsyncEngine) -> list[str]:
    problems = await login_problems(engine)
    if problems:
        structlog.get_logger("memgate.startup").error(
            "database_login_too_powerful",
            problems=problems,
            fix="log the app in as a member of the app role only; migrate with "
            "MEMGATE_MIGRATION_DATABASE_URL (docs/architecture.md, Database roles)",
        )
    return problems
