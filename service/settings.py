"""Settings: one frozen dataclass per concern, read from the environment once.

Every field is documented next to its environment variable. Tests set the environment before they
build settings; nothing below `Settings.from_env()` reads `os.environ` again.
"""

from __future__ import annotations

import ipaddress
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

_TRUE = {"1", "true", "yes", "on"}
HTTP_PARSERS = ("httptools", "h11")
TLS_MODES = ("", "self-signed")


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else int(raw)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else float(raw)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else raw.strip().lower() in _TRUE


TEXT_SEARCH_CONFIGS = (
    "simple",
    "arabic",
    "armenian",
    "basque",
    "catalan",
    "danish",
    "dutch",
    "english",
    "estonian",
    "finnish",
    "french",
    "german",
    "greek",
    "hindi",
    "hungarian",
    "indonesian",
    "irish",
    "italian",
    "lithuanian",
    "nepali",
    "norwegian",
    "portuguese",
    "romanian",
    "russian",
    "serbian",
    "spanish",
    "swedish",
    "tamil",
    "turkish",
    "yiddish",
)
"""The text search configurations PostgreSQL (16 and later) ships, the only ones a tenant may
choose: `simple` (lower-cased words, no stemming, no stop words: any language, identifiers
kept whole) and one Snowball stemmer with its stop words per language."""


READ_REPLICA_DEFAULT_LAG_MS = 250
READ_REPLICA_LAG_RANGE_MS = (20, 60_000)
"""Below 20 ms the primary is sampled every 10 ms for little gain (a healthy standby replays
within a few); above a minute, "stale" stops meaning anything a caller would accept."""


@dataclass(frozen=True)
class DatabaseSettings:
    """Where the data lives.

    url: `DATABASE_URL`; the app's login (a member of `app_role` only). Empty means start the
        embedded PostgreSQL under `data_dir`, where the service makes that login itself.
    migration_url: `MEMGATE_MIGRATION_DATABASE_URL`; the owner's login, for the migrations
        (default: `url`, which then makes `/readyz` report the login as too powerful).
    data_dir: `MEMGATE_DATA_DIR`; persistent home of the embedded cluster and the bootstrap secret.
    pool_size: `MEMGATE_DB_POOL_SIZE`; connections per process.
    app_role: `MEMGATE_DB_APP_ROLE`; every app connection runs `SET ROLE` to it. The migrations
        create it without owning anything and without UPDATE/DELETE on the audit tables. In
        production log in as a role that is only a member of it (docs/architecture.md).
    read_url: `MEMGATE_READ_DATABASE_URL`; a streaming hot standby of `url`'s primary (the same
        app login, CloudNativePG's `<cluster>-ro` Service). Empty (the default): no replica,
        every statement goes to `url`. Set: the read-only operations (search, get, list,
        history, counts, ...) run on it when it has replayed what the primary had committed
        `read_replica_max_lag_ms` ago, on the primary otherwise (docs/scale.md, "Read
        replicas for searches"). Writes and every audit row stay on the primary.
    read_replica_max_lag_ms: `MEMGATE_READ_REPLICA_MAX_LAG_MS`; the staleness bound of a
        replica's answer (default 250): it includes every change the primary had committed
        this many milliseconds before the call began, and this process's own earlier writes.
        Between 20 and 60000.
    prepared_statements: `MEMGATE_DB_PREPARED_STATEMENTS` (default on); a statement a
        connection has sent five times is prepared on the server, so its parse and plan are
        not paid again (docs/architecture.md, "Prepared statements"). Off for a pooler in
        transaction mode that cannot carry prepared statements.
    statement_timeout_ms: `MEMGATE_DB_STATEMENT_TIMEOUT_MS` (default 60000; 0: none); the
        `statement_timeout` of every app connection, so no statement (a write waiting for a
        lock a stuck transaction holds, a runaway admin read) holds a connection for ever.
        Reads of memories run under their own, shorter budget
        (`MEMGATE_READ_STATEMENT_TIMEOUT_MS`).
    """

    url: str = ""
    migration_url: str = ""
    data_dir: Path = field(default_factory=lambda: Path(platformdirs.user_data_dir("memgate")))
    pool_size: int = 10
    app_role: str = "memgate_app"
    read_url: str = ""
    read_replica_max_lag_ms: int = READ_REPLICA_DEFAULT_LAG_MS
    prepared_statements: bool = True
    statement_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.statement_timeout_ms < 0:
            raise ValueError("MEMGATE_DB_STATEMENT_TIMEOUT_MS may not be negative (0: none)")
        low, high = READ_REPLICA_LAG_RANGE_MS
        if not low <= self.read_replica_max_lag_ms <= high:
            raise ValueError(
                f"MEMGATE_READ_REPLICA_MAX_LAG_MS must be between {low} and {high} milliseconds"
            )
        if not self.read_url:
            return
        if not self.read_url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ValueError("MEMGATE_READ_DATABASE_URL must be a postgresql:// URL")
        if self.read_url == self.url:
            raise ValueError(
                "MEMGATE_READ_DATABASE_URL is DATABASE_URL: name a standby, or leave it empty"
            )

    @property
    def read_replica_max_lag(self) -> float:
        """The staleness bound in seconds."""
        return self.read_replica_max_lag_ms / 1000

    @classmethod
    def from_env(cls) -> DatabaseSettings:
        return cls(
            url=_env("DATABASE_URL", ""),
            migration_url=_env("MEMGATE_MIGRATION_DATABASE_URL", ""),
            data_dir=Path(_env("MEMGATE_DATA_DIR", platformdirs.user_data_dir("memgate"))),
            statement_timeout_ms=_env_int("MEMGATE_DB_STATEMENT_TIMEOUT_MS", 60_000),
            pool_size=_env_int("MEMGATE_DB_POOL_SIZE", 10),
            app_role=_env("MEMGATE_DB_APP_ROLE", "memgate_app"),
            read_url=_env("MEMGATE_READ_DATABASE_URL", "").strip(),
            read_replica_max_lag_ms=_env_int(
                "MEMGATE_READ_REPLICA_MAX_LAG_MS", READ_REPLICA_DEFAULT_LAG_MS
            ),
            prepared_statements=_env_bool("MEMGATE_DB_PREPARED_STATEMENTS", True),
        )


@dataclass(frozen=True)
class ServerSettings:
    """HTTP listener.

    host/port: `MEMGATE_HOST` / `MEMGATE_PORT`.
    public_url: `MEMGATE_PUBLIC_URL`; the URL clients use, also the embedded issuer (`iss`).
        Default: `<scheme>://<host>:<port>`, with `localhost` for 0.0.0.0 and `::`.
    max_body_bytes: `MEMGATE_MAX_BODY_BYTES`; larger request bodies answer 413.
    json_logs: `MEMGATE_JSON_LOGS`; JSON lines (production) instead of console rendering (dev).
    workers: `MEMGATE_WORKERS` (or `memgate serve --workers N`); worker processes serving the
        one socket, each with its own database pool, verifier and embedder. 0 (the default):
        one per core, lowered to what the database's connections allow; 1: one process, no
        workers (docs/architecture.md, "Serving").
    http_parser: `MEMGATE_HTTP_PARSER`; `httptools` (the default, the faster C parser) or `h11`
        (pure Python). Both count what they reject (service/http/server.py).
    tls_cert_file / tls_key_file: `MEMGATE_TLS_CERT_FILE` / `MEMGATE_TLS_KEY_FILE`; PEM files
        of the certificate (chain) and its private key: `serve` terminates TLS with them.
    tls: `MEMGATE_TLS`; `self-signed`: without certificate files, `serve` makes a development
        certificate on first start (`<data dir>/tls/`, mode 0600, reused on restart) and
        prints its SHA-256 fingerprint. Empty or `off`: only the files above turn TLS on.
    allow_plain_http: `MEMGATE_ALLOW_PLAIN_HTTP`; serve plain HTTP on a host that is not
        loopback. Off by default: without TLS `serve` binds loopback only. Set it behind a
        proxy or Ingress that terminates TLS (the Helm chart does).
    schema_docs: `MEMGATE_SCHEMA_DOCS`; serve the OpenAPI document at `/schema` without a
        token (1, the default: agents and their developers read it). 0: no `/schema` routes at
        all (404), as the Helm chart does by default; the document ships as openapi.yaml.
    migrate: `MEMGATE_MIGRATE` (or `memgate serve --no-migrate` for 0); `serve` migrates to
        head first as the owner (1, the default), or (0) runs as the app's login alone: it
        migrates nothing, needs no owner URL, and refuses to start unless the schema is at head
        and `memgate migrate` did the one-time owner work (keys, bootstrap).
    With TLS on, every answer carries `Strict-Transport-Security` and `public_url` defaults to
    https (docs/operations.md, "HTTPS and serving modes").
    """

    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str = "http://127.0.0.1:8080"
    max_body_bytes: int = 1_048_576
    json_logs: bool = False
    workers: int = 0
    http_parser: str = "httptools"
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls: str = ""
    allow_plain_http: bool = False
    schema_docs: bool = True
    migrate: bool = True

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError("MEMGATE_WORKERS may not be negative (0: one per core)")
        if self.http_parser not in HTTP_PARSERS:
            raise ValueError("MEMGATE_HTTP_PARSER must be httptools or h11")
        if self.tls not in TLS_MODES:
            raise ValueError("MEMGATE_TLS must be self-signed, off or empty")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("MEMGATE_TLS_CERT_FILE and MEMGATE_TLS_KEY_FILE go together")
        if self.tls == "self-signed" and self.tls_cert_file:
            raise ValueError(
                "MEMGATE_TLS=self-signed and MEMGATE_TLS_CERT_FILE exclude each other: "
                "give certificate files or ask for a self-signed one"
            )

    @property
    def tls_enabled(self) -> bool:
        """`serve` terminates TLS (certificate files given, or a self-signed one asked for)."""
        return bool(self.tls_cert_file) or self.tls == "self-signed"

    @classmethod
    def from_env(cls) -> ServerSettings:
        host = _env("MEMGATE_HOST", "127.0.0.1")
        port = _env_int("MEMGATE_PORT", 8080)
        cert_file = _env("MEMGATE_TLS_CERT_FILE", "")
        tls = _env("MEMGATE_TLS", "").strip().lower()
        tls = "" if tls == "off" else tls
        scheme = "https" if cert_file or tls == "self-signed" else "http"
        return cls(
            host=host,
            port=port,
            public_url=_env("MEMGATE_PUBLIC_URL", f"{scheme}://{_url_host(host)}:{port}").rstrip(
                "/"
            ),
            max_body_bytes=_env_int("MEMGATE_MAX_BODY_BYTES", 1_048_576),
            json_logs=_env_bool("MEMGATE_JSON_LOGS", False),
            workers=_env_int("MEMGATE_WORKERS", 0),
            http_parser=_env("MEMGATE_HTTP_PARSER", "httptools").strip().lower() or "httptools",
            tls_cert_file=cert_file,
            tls_key_file=_env("MEMGATE_TLS_KEY_FILE", ""),
            tls=tls,
            allow_plain_http=_env_bool("MEMGATE_ALLOW_PLAIN_HTTP", False),
            schema_docs=_env_bool("MEMGATE_SCHEMA_DOCS", True),
            migrate=_env_bool("MEMGATE_MIGRATE", True),
        )


def _url_host(host: str) -> str:
    """The host of the default public URL: `localhost` for an unspecified address (0.0.0.0 or
    `::`, the image's default, names no host a client can reach or a certificate can carry:
    the banner's curl line and `memgate token` failed to verify it); an IPv6 literal in
    brackets."""
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return "localhost"
    except ValueError:
        pass  # a name
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class ExternalIssuer:
    """A trusted external identity provider (Keycloak, Entra, Auth0 ...).

    The claim names say where the tenant, subject and scopes live in that IdP's tokens; the
    subject is mapped to a memgate principal through `principals.external_subject`.
    """

    issuer: str
    audience: str
    jwks_url: str
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    require_typ: bool = True
    tenant_claim: str = "tenant"
    subject_claim: str = "sub"
    scope_claim: str = "scope"
    client_id_claim: str = "client_id"

    @classmethod
    def from_mapping(cls, raw: dict[str, Any]) -> ExternalIssuer:
        values = dict(raw)
        if "algorithms" in values:
            values["algorithms"] = tuple(values["algorithms"])
        return cls(**values)


@dataclass(frozen=True)
class AuthSettings:
    """Token issuing and verification.

    audience: `MEMGATE_AUDIENCE`; the `aud` every accepted token must carry exactly.
    embedded_issuer: `MEMGATE_EMBEDDED_ISSUER`; run the built-in authorization server.
    token_ttl_seconds: `MEMGATE_TOKEN_TTL`; lifetime of issued access tokens (default 10 min).
    max_token_ttl_seconds: `MEMGATE_MAX_TOKEN_TTL`; tokens living longer (exp - iat) are refused.
    leeway_seconds: `MEMGATE_TOKEN_LEEWAY`; clock skew allowed on exp/nbf/iat (at most 60).
    key_encryption_key: `MEMGATE_KEY_ENCRYPTION_KEY`; base64url 32 bytes encrypting signing keys
        at rest. Empty: a key file `key-encryption.key` (0600) in the data dir is used/created.
    signing_alg: `MEMGATE_SIGNING_ALG`; ES256 or EdDSA.
    jwks_refetch_seconds: `MEMGATE_JWKS_REFETCH_SECONDS`; minimum gap between key refetches
        caused by an unknown `kid` (bounds what junk kids can cost).
    external_issuers: `MEMGATE_EXTERNAL_ISSUERS`; JSON list of `ExternalIssuer` fields.
    token_max_in_flight: `MEMGATE_TOKEN_MAX_IN_FLIGHT`; token requests this process works on at
        once (waiting for or running a secret check); more answer 503 with `Retry-After`.
    token_max_in_flight_per_source: `MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_SOURCE`; the share of that
        bound one source address (an IPv6 /64) may hold (at most the bound; more answer 503).
        Behind a proxy every caller shares its address: raise it to the bound there.
    token_max_in_flight_per_client: `MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_CLIENT`; the share one
        client id may hold (at most the bound). Also the most failures of one client id that
        can be in flight before the first of them counts.
    token_failure_burst: `MEMGATE_TOKEN_FAILURE_BURST`; failed client authentications a client
        id, and separately a source address, may have at once before answers turn to 429.
    token_failures_per_minute: `MEMGATE_TOKEN_FAILURES_PER_MINUTE`; how fast that allowance
        comes back. Both limits are per process (docs/security.md).
    token_db_wait_seconds: `MEMGATE_TOKEN_DB_WAIT_SECONDS`; longest a token request waits for
        the database (a pool connection, its lookups) before it answers 503.
    tenant_issuers_allow_loopback: `MEMGATE_TENANT_ISSUERS_ALLOW_LOOPBACK`; let tenant admins
        register JWKS URLs on loopback (`http://127.0.0.1`, `http://localhost`, `[::1]`), for
        tests and an IdP on the same host. Off: https only, and never to a private, loopback,
        link-local or otherwise non-global address (docs/tenants.md, External issuers).
    tenant_jwks_timeout_seconds: `MEMGATE_TENANT_JWKS_TIMEOUT_SECONDS`; the whole of one fetch
        of a tenant-registered JWKS (resolve, connect, read); a token waiting for it fails 401.
    tenant_issuer_cache_seconds: `MEMGATE_TENANT_ISSUER_CACHE_SECONDS`; how long a worker keeps
        a tenant issuer's verification config (0 to 10). Deleting an issuer still stops its
        tokens on the next request: the entrance statement checks the row is there.
    """

    audience: str = "memgate"
    embedded_issuer: bool = True
    token_ttl_seconds: int = 600
    max_token_ttl_seconds: int = 3600
    leeway_seconds: int = 30
    key_encryption_key: str = ""
    signing_alg: str = "ES256"
    jwks_refetch_seconds: float = 30.0
    external_issuers: tuple[ExternalIssuer, ...] = ()
    token_max_in_flight: int = 16
    token_max_in_flight_per_source: int = 8
    token_max_in_flight_per_client: int = 4
    token_failure_burst: int = 10
    token_failures_per_minute: float = 10.0
    token_db_wait_seconds: float = 2.0
    tenant_issuers_allow_loopback: bool = False
    tenant_jwks_timeout_seconds: float = 3.0
    tenant_issuer_cache_seconds: float = 5.0
    bootstrap_admin_client_id: str = ""
    bootstrap_admin_secret: str = field(default="", repr=False)

    @property
    def trusted_external_issuers(self) -> frozenset[str]:
        """The `iss` values of the external issuers: the only ones a principal may be mapped to
        (a mapping to any other could never log in)."""
        return frozenset(external.issuer for external in self.external_issuers)

    def __post_init__(self) -> None:
        if (
            min(
                self.token_max_in_flight,
                self.token_max_in_flight_per_source,
                self.token_max_in_flight_per_client,
                self.token_failure_burst,
            )
            < 1
        ):
            raise ValueError(
                "MEMGATE_TOKEN_MAX_IN_FLIGHT, MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_SOURCE, "
                "MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_CLIENT and MEMGATE_TOKEN_FAILURE_BURST must be "
                "at least 1"
            )
        if self.token_failures_per_minute <= 0 or self.token_db_wait_seconds <= 0:
            raise ValueError(
                "MEMGATE_TOKEN_FAILURES_PER_MINUTE and MEMGATE_TOKEN_DB_WAIT_SECONDS must be "
                "positive"
            )
        if not 0 <= self.tenant_issuer_cache_seconds <= 10:
            raise ValueError("MEMGATE_TENANT_ISSUER_CACHE_SECONDS must be between 0 and 10")
        if not 0 < self.tenant_jwks_timeout_seconds <= 30:
            raise ValueError("MEMGATE_TENANT_JWKS_TIMEOUT_SECONDS must be above 0, at most 30")
        if not 0 <= self.leeway_seconds <= 60:
            raise ValueError("MEMGATE_TOKEN_LEEWAY must be between 0 and 60 seconds")
        if self.signing_alg not in {"ES256", "EdDSA"}:
            raise ValueError("MEMGATE_SIGNING_ALG must be ES256 or EdDSA")
        if self.token_ttl_seconds > self.max_token_ttl_seconds:
            raise ValueError("MEMGATE_TOKEN_TTL may not exceed MEMGATE_MAX_TOKEN_TTL")
        self._check_bootstrap_admin()

    def _check_bootstrap_admin(self) -> None:
        if bool(self.bootstrap_admin_client_id) != bool(self.bootstrap_admin_secret):
            raise ValueError(
                "MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID and MEMGATE_BOOTSTRAP_ADMIN_SECRET go together"
            )
        if not self.bootstrap_admin_client_id:
            return
        try:
            uuid.UUID(self.bootstrap_admin_client_id)
        except ValueError:
            raise ValueError("MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID must be a UUID") from None
        if len(self.bootstrap_admin_secret) < 32:
            raise ValueError("MEMGATE_BOOTSTRAP_ADMIN_SECRET must be at least 32 characters")

    @classmethod
    def from_env(cls) -> AuthSettings:
        issuers_raw = json.loads(_env("MEMGATE_EXTERNAL_ISSUERS", "[]"))
        return cls(
            audience=_env("MEMGATE_AUDIENCE", "memgate"),
            embedded_issuer=_env_bool("MEMGATE_EMBEDDED_ISSUER", True),
            token_ttl_seconds=_env_int("MEMGATE_TOKEN_TTL", 600),
            max_token_ttl_seconds=_env_int("MEMGATE_MAX_TOKEN_TTL", 3600),
            leeway_seconds=_env_int("MEMGATE_TOKEN_LEEWAY", 30),
            key_encryption_key=_env("MEMGATE_KEY_ENCRYPTION_KEY", ""),
            signing_alg=_env("MEMGATE_SIGNING_ALG", "ES256"),
            jwks_refetch_seconds=float(_env("MEMGATE_JWKS_REFETCH_SECONDS", "30")),
            external_issuers=tuple(ExternalIssuer.from_mapping(i) for i in issuers_raw),
            token_max_in_flight=_env_int("MEMGATE_TOKEN_MAX_IN_FLIGHT", 16),
            token_max_in_flight_per_source=_env_int("MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_SOURCE", 8),
            token_max_in_flight_per_client=_env_int("MEMGATE_TOKEN_MAX_IN_FLIGHT_PER_CLIENT", 4),
            token_failure_burst=_env_int("MEMGATE_TOKEN_FAILURE_BURST", 10),
            token_failures_per_minute=float(_env("MEMGATE_TOKEN_FAILURES_PER_MINUTE", "10")),
            token_db_wait_seconds=float(_env("MEMGATE_TOKEN_DB_WAIT_SECONDS", "2")),
            tenant_issuers_allow_loopback=_env_bool("MEMGATE_TENANT_ISSUERS_ALLOW_LOOPBACK", False),
            tenant_jwks_timeout_seconds=float(_env("MEMGATE_TENANT_JWKS_TIMEOUT_SECONDS", "3")),
            tenant_issuer_cache_seconds=float(_env("MEMGATE_TENANT_ISSUER_CACHE_SECONDS", "5")),
            bootstrap_admin_client_id=_env("MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID", "").strip(),
            bootstrap_admin_secret=_env("MEMGATE_BOOTSTRAP_ADMIN_SECRET", "").strip(),
        )


@dataclass(frozen=True)
class EmbeddingSettings:
    """Embedding provider.

    provider: `MEMGATE_EMBEDDING_PROVIDER`; wordllama (offline default), ollama or openai.
    model: `MEMGATE_EMBEDDING_MODEL`; model name for the provider.
    dimensions: `MEMGATE_EMBEDDING_DIMENSIONS`; must equal the schema's vector size (256).
    base_url / api_key: `MEMGATE_EMBEDDING_URL` / `MEMGATE_EMBEDDING_API_KEY` for HTTP providers.
    timeout_seconds / retries: `MEMGATE_EMBEDDING_TIMEOUT` (per attempt, the whole answer
        included; above 0, at most 60) / `MEMGATE_EMBEDDING_RETRIES` (0..5).
    """

    provider: str = "wordllama"
    model: str = "l2_supercat"
    dimensions: int = 256
    base_url: str = ""
    api_key: str = ""
    timeout_seconds: float = 10.0
    retries: int = 2

    def __post_init__(self) -> None:
        # On every write and search: a hostile or stuck provider holds a call for at most
        # (retries + 1) x timeout, plus backoffs.
        if not 0 <= self.retries <= 5 or not 0 < self.timeout_seconds <= 60:
            raise ValueError(
                "MEMGATE_EMBEDDING_RETRIES must be 0..5 and MEMGATE_EMBEDDING_TIMEOUT above 0 "
                "and at most 60 seconds"
            )

    @classmethod
    def from_env(cls) -> EmbeddingSettings:
        return cls(
            provider=_env("MEMGATE_EMBEDDING_PROVIDER", "wordllama"),
            model=_env("MEMGATE_EMBEDDING_MODEL", "l2_supercat"),
            dimensions=_env_int("MEMGATE_EMBEDDING_DIMENSIONS", 256),
            base_url=_env("MEMGATE_EMBEDDING_URL", ""),
            api_key=_env("MEMGATE_EMBEDDING_API_KEY", ""),
            timeout_seconds=float(_env("MEMGATE_EMBEDDING_TIMEOUT", "10")),
            retries=_env_int("MEMGATE_EMBEDDING_RETRIES", 2),
        )


SUMMARIZER_KINDS = ("extractive", "openai", "ollama")


@dataclass(frozen=True)
class SummarizerSettings:
    """How `memory.consolidate` writes a summary (docs/jobs.md, "memory.consolidate").

    kind: `MEMGATE_SUMMARIZER_KIND`; `extractive` (default: no model, deterministic: the
        inputs' values newest first, de-duplicated, capped), `openai` (an OpenAI-compatible
        `/v1/chat/completions`) or `ollama` (`/api/chat`). The model sees the text of every
        input of a summary: point it only at an endpoint trusted with that data.
    url: `MEMGATE_SUMMARIZER_URL`; the endpoint's base URL (required for a model).
    model: `MEMGATE_SUMMARIZER_MODEL`; the model name sent to the endpoint.
    api_key: `MEMGATE_SUMMARIZER_API_KEY`; sent as a bearer token when set.
    timeout_seconds: `MEMGATE_SUMMARIZER_TIMEOUT`; per attempt, the whole answer included
        (above 0, at most 600).
    retries: `MEMGATE_SUMMARIZER_RETRIES`; further attempts on transient failures (0..5).
    max_chars: `MEMGATE_SUMMARIZER_MAX_CHARS`; the longest summary kept (a longer answer is
        cut; also capped by `MEMGATE_MAX_VALUE_CHARS`).
    max_inputs: `MEMGATE_SUMMARIZER_MAX_INPUTS`; the most memories one summary is built from
        (the newest; the fingerprint covers exactly these).
    """

    kind: str = "extractive"
    url: str = ""
    model: str = ""
    api_key: str = ""
    timeout_seconds: float = 30.0
    retries: int = 2
    max_chars: int = 4_000
    max_inputs: int = 200

    def __post_init__(self) -> None:
        if self.kind not in SUMMARIZER_KINDS:
            raise ValueError(
                "MEMGATE_SUMMARIZER_KIND must be one of " + ", ".join(SUMMARIZER_KINDS)
            )
        if self.kind != "extractive" and not (self.url and self.model):
            raise ValueError("MEMGATE_SUMMARIZER_URL and _MODEL are required for a model")
        if not 0 <= self.retries <= 5 or not 0 < self.timeout_seconds <= 600:
            raise ValueError(
                "MEMGATE_SUMMARIZER_RETRIES must be 0..5 and _TIMEOUT above 0 and at most 600"
            )
        if not 1 <= self.max_chars <= 16_384 or not 1 <= self.max_inputs <= 1_000:
            raise ValueError("MEMGATE_SUMMARIZER_MAX_CHARS 1..16384, _MAX_INPUTS 1..1000")

    @classmethod
    def from_env(cls) -> SummarizerSettings:
        return cls(
            kind=_env("MEMGATE_SUMMARIZER_KIND", "extractive"),
            url=_env("MEMGATE_SUMMARIZER_URL", ""),
            model=_env("MEMGATE_SUMMARIZER_MODEL", ""),
            api_key=_env("MEMGATE_SUMMARIZER_API_KEY", ""),
            timeout_seconds=_env_float("MEMGATE_SUMMARIZER_TIMEOUT", 30.0),
            retries=_env_int("MEMGATE_SUMMARIZER_RETRIES", 2),
            max_chars=_env_int("MEMGATE_SUMMARIZER_MAX_CHARS", 4_000),
            max_inputs=_env_int("MEMGATE_SUMMARIZER_MAX_INPUTS", 200),
        )


BATCH_ITEMS_CEILING = 500
"""The most `MEMGATE_BATCH_MAX_ITEMS` may be: a batch writes one memory and supersedes at most
one version per item, and its one audit row names at most 1000 targets (service/calls.py
`MAX_TARGETS`; a test holds the two together)."""


@dataclass(frozen=True)
class MemorySettings:
    """Limits of the memory API (each violation answers a problem, never truncates).

    max_value_chars: `MEMGATE_MAX_VALUE_CHARS`; longest memory value.
    max_k: `MEMGATE_MAX_K`; largest `k` a search may ask for.
    default_k: `MEMGATE_DEFAULT_K`.
    max_page_size: `MEMGATE_MAX_PAGE_SIZE`; largest `limit` of a list page.
    exact_search_max_rows: `MEMGATE_SEARCH_EXACT_MAX_ROWS`; up to this many visible rows a
        search ranks every one (exact); beyond, it walks the HNSW index (approximate).
    ann_ef_search: `MEMGATE_SEARCH_ANN_EF`; the HNSW candidate list (`hnsw.ef_search`).
    ann_max_scan_tuples: `MEMGATE_SEARCH_ANN_MAX_SCAN`; how far the iterative scan may walk
        (`hnsw.max_scan_tuples`) before the search falls back to the exact path.
    search_fallback_max_rows: `MEMGATE_SEARCH_FALLBACK_MAX_ROWS`; the most visible rows one
        search may cover at all. Above the exact limit a walk that cannot answer (short of k,
        or a `min_score` cutting into its k) is ranked exactly, at a cost linear in the
        visible set; beyond this many rows the search is refused up front (422
        `search-too-broad`: narrow by space, kind, subject or key), so that cost is bounded.
        At least `exact_search_max_rows`.
    read_statement_timeout_ms: `MEMGATE_READ_STATEMENT_TIMEOUT_MS`; `statement_timeout` of
        every statement that reads memories (search, get, list, counts), set per transaction
        and restored after; a read cancelled by it answers 422 (`search-too-broad`,
        `read-too-broad`), never runs on unbounded.
    default_ttl_seconds: no operator-wide default (None: a write without `ttl_seconds` never
        expires); a tenant's `default_ttl_seconds` setting fills it (service/tenants/settings.py).
    score_floor: `MEMGATE_SEARCH_SCORE_FLOOR`; the cosine a hit must reach when neither the
        request (`min_score`) nor the tenant (`score_floor`) names one (0..1; 0 = no floor).
        0.25 sits between what the default WordLlama embedder gives unrelated questions
        (<= 0.21) and real matches (>= 0.3): docs/recall.md, "Hybrid recall".
    lexical_floor: `MEMGATE_SEARCH_LEXICAL_FLOOR`; the share of a query's term weight (0..1,
        terms weighted by rarity among the rows the caller sees) a row must match to be a hit
        on its words alone, below the cosine floor. Common words ("is", "the") weigh almost
        nothing, so they never let a stranger in.
    fusion_depth: `MEMGATE_SEARCH_FUSION_DEPTH`; how many candidates each leg of a hybrid
        search ranks before reciprocal rank fusion (1..1000; a search of a larger `k` ranks
        `k`, so either leg alone can fill its answer).
    text_search_config: `MEMGATE_TEXT_SEARCH_CONFIG`; the PostgreSQL text search configuration
        of tenants that choose none (service/tenants/settings.py `TEXT_SEARCH_CONFIGS`).
    batch_max_items: `MEMGATE_BATCH_MAX_ITEMS`; the most items one `POST /v1/memories:batch`
        takes (1..`BATCH_ITEMS_CEILING`, 500; the body must also fit `MEMGATE_MAX_BODY_BYTES`).
        Bounded so the batch's audit row names every memory it wrote and every version it
        superseded (at most one per item): 2 x 500 fits the row's 1000 target ids.
    """

    max_value_chars: int = 16_384
    max_k: int = 100
    default_k: int = 10
    max_page_size: int = 100
    exact_search_max_rows: int = 20_000
    ann_ef_search: int = 200
    ann_max_scan_tuples: int = 40_000
    search_fallback_max_rows: int = 50_000
    read_statement_timeout_ms: int = 3_000
    default_ttl_seconds: int | None = None
    score_floor: float = 0.25
    lexical_floor: float = 0.5
    fusion_depth: int = 100
    text_search_config: str = "english"
    batch_max_items: int = 500

    def __post_init__(self) -> None:
        # Refused at start: a bad value would otherwise fail every large search, per request.
        if self.exact_search_max_rows < 0:
            raise ValueError("MEMGATE_SEARCH_EXACT_MAX_ROWS may not be negative")
        if not 1 <= self.ann_ef_search <= 1000:  # pgvector's range for hnsw.ef_search
            raise ValueError("MEMGATE_SEARCH_ANN_EF must be between 1 and 1000")
        if self.ann_max_scan_tuples < 1:
            raise ValueError("MEMGATE_SEARCH_ANN_MAX_SCAN must be at least 1")
        if self.search_fallback_max_rows < self.exact_search_max_rows:
            raise ValueError(
                "MEMGATE_SEARCH_FALLBACK_MAX_ROWS may not be below MEMGATE_SEARCH_EXACT_MAX_ROWS"
            )
        if self.read_statement_timeout_ms < 1:  # 0 would mean no timeout at all
            raise ValueError("MEMGATE_READ_STATEMENT_TIMEOUT_MS must be at least 1")
        if not 0 <= self.score_floor <= 1:
            raise ValueError("MEMGATE_SEARCH_SCORE_FLOOR must be between 0 and 1")
        if not 0 < self.lexical_floor <= 1:
            raise ValueError("MEMGATE_SEARCH_LEXICAL_FLOOR must be above 0 and at most 1")
        if not 1 <= self.fusion_depth <= 1000:
            raise ValueError("MEMGATE_SEARCH_FUSION_DEPTH must be between 1 and 1000")
        if not 1 <= self.batch_max_items <= BATCH_ITEMS_CEILING:
            raise ValueError(f"MEMGATE_BATCH_MAX_ITEMS must be between 1 and {BATCH_ITEMS_CEILING}")
        if self.text_search_config not in TEXT_SEARCH_CONFIGS:
            raise ValueError(
                "MEMGATE_TEXT_SEARCH_CONFIG must be one of " + ", ".join(TEXT_SEARCH_CONFIGS)
            )

    @classmethod
    def from_env(cls) -> MemorySettings:
        return cls(
            max_value_chars=_env_int("MEMGATE_MAX_VALUE_CHARS", 16_384),
            max_k=_env_int("MEMGATE_MAX_K", 100),
            default_k=_env_int("MEMGATE_DEFAULT_K", 10),
            max_page_size=_env_int("MEMGATE_MAX_PAGE_SIZE", 100),
            exact_search_max_rows=_env_int("MEMGATE_SEARCH_EXACT_MAX_ROWS", 20_000),
            ann_ef_search=_env_int("MEMGATE_SEARCH_ANN_EF", 200),
            ann_max_scan_tuples=_env_int("MEMGATE_SEARCH_ANN_MAX_SCAN", 40_000),
            search_fallback_max_rows=_env_int("MEMGATE_SEARCH_FALLBACK_MAX_ROWS", 50_000),
            read_statement_timeout_ms=_env_int("MEMGATE_READ_STATEMENT_TIMEOUT_MS", 3_000),
            score_floor=_env_float("MEMGATE_SEARCH_SCORE_FLOOR", 0.25),
            lexical_floor=_env_float("MEMGATE_SEARCH_LEXICAL_FLOOR", 0.5),
            fusion_depth=_env_int("MEMGATE_SEARCH_FUSION_DEPTH", 100),
            text_search_config=_env("MEMGATE_TEXT_SEARCH_CONFIG", "english"),
            batch_max_items=_env_int("MEMGATE_BATCH_MAX_ITEMS", 500),
        )


@dataclass(frozen=True)
class ObservabilitySettings:
    """Traces and metrics (OpenTelemetry). Prometheus text is served at `/metrics` on a
    listener of its own, never on the public one (it shows every tenant's activity by route).

    otlp_endpoint: `OTEL_EXPORTER_OTLP_ENDPOINT` (the standard variable); when set, traces and
        metrics are also pushed there by OTLP over HTTP (`/v1/traces`, `/v1/metrics` appended).
        Empty: no exporter; spans are dropped and metrics are only scraped.
    service_name: `OTEL_SERVICE_NAME`; the `service.name` resource attribute.
    metrics_host/metrics_port: `MEMGATE_METRICS_HOST` / `MEMGATE_METRICS_PORT`; where
        `memgate serve` serves `GET /metrics` (no token). Loopback by default; in a pod set the
        host to `0.0.0.0` and let a NetworkPolicy admit only the scraper to that port. Port 0
        turns the metrics listener off (OTLP push still works).
    """

    otlp_endpoint: str = ""
    service_name: str = "memgate"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464

    @classmethod
    def from_env(cls) -> ObservabilitySettings:
        return cls(
            otlp_endpoint=_env("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/"),
            service_name=_env("OTEL_SERVICE_NAME", "memgate") or "memgate",
            metrics_host=_env("MEMGATE_METRICS_HOST", "127.0.0.1"),
            metrics_port=_env_int("MEMGATE_METRICS_PORT", 9464),
        )


@dataclass(frozen=True)
class AuditSettings:
    """The audit log.

    checkpoint_seconds: `MEMGATE_AUDIT_CHECKPOINT_SECONDS`; how often the service signs a
        checkpoint for every tenant whose chain grew (0 turns the in-process signer off, e.g. when
        a CronJob runs `memgate audit checkpoint`).
    checkpoint_rows: `MEMGATE_AUDIT_CHECKPOINT_ROWS`; also sign a checkpoint whenever a chain's
        seq reaches a multiple of this, in the transaction that appends that row (0: by time
        only). With both, the tail after the newest checkpoint is at most this many rows and
        `checkpoint_seconds` old (docs/audit.md, "What a cut tail can hide").
    """

    checkpoint_seconds: int = 300
    checkpoint_rows: int = 1000

    @classmethod
    def from_env(cls) -> AuditSettings:
        return cls(
            checkpoint_seconds=_env_int("MEMGATE_AUDIT_CHECKPOINT_SECONDS", 300),
            checkpoint_rows=_env_int("MEMGATE_AUDIT_CHECKPOINT_ROWS", 1000),
        )


@dataclass(frozen=True)
class QuotaSettings:
    """How quotas are enforced across replicas (the limits themselves are per tenant, in the
    database: service/quotas, docs/tenants.md "Quotas and rate limits").

    lease_seconds: `MEMGATE_QUOTA_LEASE_SECONDS`; a replica leases about this many seconds'
        worth of a bucket's rate at once (at least 1 token, at most `lease_max`) and drops what
        it has not spent after this long. Any window lets through at most rate x this many
        requests more than one bucket would, whatever the number of replicas.
    lease_max: `MEMGATE_QUOTA_LEASE_MAX`; the most tokens one lease takes.
    config_seconds: `MEMGATE_QUOTA_CONFIG_SECONDS`; how long a replica keeps a tenant's
        limits before reading them again: a change bites on every replica within this, and a
        tenant without limits costs one small read per this many seconds, not per request.
    slot_seconds: `MEMGATE_QUOTA_SLOT_SECONDS`; how long concurrent-request slots a replica
        holds stay counted without being renewed, so a killed replica's slots come back. Keep
        it above the longest request.
    """

    lease_seconds: float = 0.1
    lease_max: int = 16
    config_seconds: float = 5.0
    slot_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.lease_seconds <= 10 or not 1 <= self.lease_max <= 1000:
            raise ValueError("MEMGATE_QUOTA_LEASE_SECONDS must be in (0, 10], _MAX in 1..1000")
        if not 0 <= self.config_seconds <= 300 or not 1 <= self.slot_seconds <= 3600:
            raise ValueError("MEMGATE_QUOTA_CONFIG_SECONDS 0..300, _SLOT_SECONDS 1..3600")

    @classmethod
    def from_env(cls) -> QuotaSettings:
        return cls(
            lease_seconds=float(_env("MEMGATE_QUOTA_LEASE_SECONDS", "0.1")),
            lease_max=_env_int("MEMGATE_QUOTA_LEASE_MAX", 16),
            config_seconds=float(_env("MEMGATE_QUOTA_CONFIG_SECONDS", "5")),
            slot_seconds=float(_env("MEMGATE_QUOTA_SLOT_SECONDS", "60")),
        )


@dataclass(frozen=True)
class RecallSettings:
    """How last recalls are noted (service/memory/recalls.py, docs/jobs.md "memory.age_unused").

    A search or get notes the ids it returned in this process's memory; a background task
    writes them, one statement per tenant, every `flush_seconds` or as soon as `flush_ids` are
    waiting. What is waiting when the process dies is lost (at most `flush_seconds` of
    recalls); a clean stop writes it.

    flush_seconds: `MEMGATE_RECALL_FLUSH_SECONDS`; the longest a noted recall waits (0 < s <= 300).
    flush_ids: `MEMGATE_RECALL_FLUSH_IDS`; write at once when this many ids wait.
    max_pending: `MEMGATE_RECALL_MAX_PENDING`; the most ids held at once: past it, new recalls
        are dropped (counted in the log) rather than growing the buffer while the database is
        unreachable. At least `flush_ids`.
    """

    flush_seconds: float = 5.0
    flush_ids: int = 1000
    max_pending: int = 50_000

    def __post_init__(self) -> None:
        if not 0 < self.flush_seconds <= 300:
            raise ValueError("MEMGATE_RECALL_FLUSH_SECONDS must be in (0, 300]")
        if not 1 <= self.flush_ids <= self.max_pending <= 10_000_000:
            raise ValueError(
                "MEMGATE_RECALL_FLUSH_IDS must be at least 1 and at most "
                "MEMGATE_RECALL_MAX_PENDING (at most 10,000,000)"
            )

    @classmethod
    def from_env(cls) -> RecallSettings:
        return cls(
            flush_seconds=_env_float("MEMGATE_RECALL_FLUSH_SECONDS", 5.0),
            flush_ids=_env_int("MEMGATE_RECALL_FLUSH_IDS", 1000),
            max_pending=_env_int("MEMGATE_RECALL_MAX_PENDING", 50_000),
        )


@dataclass(frozen=True)
class JobSettings:
    """The job runner (service/jobs/, docs/jobs.md).

    batch_size: `MEMGATE_JOBS_BATCH_SIZE`; the most items one batch (one transaction) handles.
    lease_seconds: `MEMGATE_JOBS_LEASE_SECONDS`; a running run whose heartbeat (written by every
        batch) is older than this is taken to be abandoned (its process died) and is taken up
        again from its last committed cursor. Keep it above the longest batch.
    poll_seconds: `MEMGATE_JOBS_POLL_SECONDS`; how often `serve` looks for queued and abandoned
        runs (0: `serve` runs no jobs at all; a CronJob's `memgate jobs run` does).
    schedule: `MEMGATE_JOBS_SCHEDULE`; the in-process scheduler of `serve`: `name=seconds`
        pairs, comma-separated (`memory.sweep_expired=3600`). Each interval, a run of that job
        is queued in every enabled tenant that has none queued or running. Empty: no schedule.
    retention_days: `MEMGATE_RETENTION_DAYS`; how long `memory.sweep_expired` keeps a memory past
        its `expires_at` before deleting it, for tenants whose `retention_days` setting is unset.
    max_pending: `MEMGATE_JOBS_MAX_PENDING`; the most runs one tenant may have queued or running
        when a caller (REST, MCP) asks for another: beyond it the request is answered 429
        `job-queue-full` with `Retry-After` (the operator's CLI and schedule are not capped;
        their runs are one per job and space, joined when identical).
    """

    batch_size: int = 100
    lease_seconds: float = 300.0
    poll_seconds: float = 2.0
    schedule: tuple[tuple[str, float], ...] = ()
    retention_days: int = 30
    max_pending: int = 20

    def __post_init__(self) -> None:
        if not 1 <= self.max_pending <= 10_000:
            raise ValueError("MEMGATE_JOBS_MAX_PENDING must be in 1..10000")
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("MEMGATE_JOBS_BATCH_SIZE must be in 1..10000")
        if self.lease_seconds <= 0 or self.poll_seconds < 0:
            raise ValueError("MEMGATE_JOBS_LEASE_SECONDS > 0, MEMGATE_JOBS_POLL_SECONDS >= 0")
        if not 0 <= self.retention_days <= 36_500:
            raise ValueError("MEMGATE_RETENTION_DAYS must be in 0..36500")
        if any(seconds <= 0 for _, seconds in self.schedule):
            raise ValueError("MEMGATE_JOBS_SCHEDULE intervals must be positive seconds")

    @classmethod
    def from_env(cls) -> JobSettings:
        return cls(
            batch_size=_env_int("MEMGATE_JOBS_BATCH_SIZE", 100),
            lease_seconds=_env_float("MEMGATE_JOBS_LEASE_SECONDS", 300.0),
            poll_seconds=_env_float("MEMGATE_JOBS_POLL_SECONDS", 2.0),
            schedule=parse_schedule(_env("MEMGATE_JOBS_SCHEDULE", "")),
            retention_days=_env_int("MEMGATE_RETENTION_DAYS", 30),
            max_pending=_env_int("MEMGATE_JOBS_MAX_PENDING", 20),
        )


def parse_schedule(raw: str) -> tuple[tuple[str, float], ...]:
    """`memory.sweep_expired=3600,audit.checkpoint=300` as ((name, seconds), ...)."""
    pairs: list[tuple[str, float]] = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, seconds = item.partition("=")
        try:
            pairs.append((name.strip(), float(seconds)))
        except ValueError:
            raise ValueError(
                f"MEMGATE_JOBS_SCHEDULE: {item!r} is not name=seconds "
                "(for example memory.sweep_expired=3600)"
            ) from None
    return tuple(pairs)


@dataclass(frozen=True)
class ShreddingSettings:
    """Where crypto-shredding keeps its per-owner data keys (docs/erasure.md, "Crypto-shredding").

    data_key_store: `MEMGATE_DATA_KEY_STORE`; `file` (the default: one wrapped key per file under
        `data_key_dir`, on this machine only) or `module:factory`, the import path of a callable
        taking these settings and returning a `service.shredding.DataKeyStore` (the KMS plug
        point). The keys must live outside PostgreSQL: a copy of the database must not hold them.
    data_key_dir: `MEMGATE_DATA_KEY_DIR`; the file store's folder (default: `data-keys` in the
        data dir). Never inside the PostgreSQL data directory or anything backed up with it.
    on_kubernetes: set when `KUBERNETES_SERVICE_HOST` is (a pod). There the file store is not
        shared between replicas nor kept across pod restarts, so no tenant may turn
        crypto-shredding on with it: use a KMS store.
    """

    data_key_store: str = "file"
    data_key_dir: Path | None = None
    on_kubernetes: bool = False

    def __post_init__(self) -> None:
        if self.data_key_store != "file" and ":" not in self.data_key_store:
            raise ValueError(
                "MEMGATE_DATA_KEY_STORE must be 'file' or 'module:factory' (a KMS plug point)"
            )

    def key_dir(self, data_dir: Path) -> Path:
        return self.data_key_dir or data_dir / "data-keys"

    @classmethod
    def from_env(cls) -> ShreddingSettings:
        folder = _env("MEMGATE_DATA_KEY_DIR", "")
        return cls(
            data_key_store=_env("MEMGATE_DATA_KEY_STORE", "file").strip() or "file",
            data_key_dir=Path(folder) if folder else None,
            on_kubernetes=bool(_env("KUBERNETES_SERVICE_HOST", "")),
        )


@dataclass(frozen=True)
class Settings:
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    quotas: QuotaSettings = field(default_factory=QuotaSettings)
    recalls: RecallSettings = field(default_factory=RecallSettings)
    summarizer: SummarizerSettings = field(default_factory=SummarizerSettings)
    jobs: JobSettings = field(default_factory=JobSettings)
    shredding: ShreddingSettings = field(default_factory=ShreddingSettings)

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database=DatabaseSettings.from_env(),
            server=ServerSettings.from_env(),
            auth=AuthSettings.from_env(),
            embedding=EmbeddingSettings.from_env(),
            memory=MemorySettings.from_env(),
            observability=ObservabilitySettings.from_env(),
            audit=AuditSettings.from_env(),
            quotas=QuotaSettings.from_env(),
            recalls=RecallSettings.from_env(),
            summarizer=SummarizerSettings.from_env(),
            jobs=JobSettings.from_env(),
            shredding=ShreddingSettings.from_env(),
        )
