"""The call: one operation's unit of work, whatever carried it (HTTP, MCP, a job).

A `Call` is where "this caller does this, under policy, audited, in one transaction" holds:

- **session**: `call.db` is the call's one database session. It is made on first use and begins
  its transaction on its first statement, so nothing holds a pooled connection while the
  embedding provider answers; the transaction's first act names the caller for row-level
  security (no caller: no memory row is visible).
- **facts**: services note what only they know (targets, counts, the identity a token request
  proved) on `call.facts`; the transport adds the reason a call was refused.
- **finish**: `call.finish(status)` ends it. A call that wrote appends its audit row in its
  own transaction and commits both together; a read, and anything that failed or was refused
  (rolled back), has its row group-committed with other such rows
  (service/audit/group_commit.py) before the answer, or on its own if the group fails. If the
  row cannot be appended or the commit is not confirmed, finish answers a `ServiceUnavailable`
  to send instead: a call is never answered unaudited.

- **replica**: a read-only call that authenticates here (`enter`) runs on the read replica
  when one is configured and fresh enough, its first statement checking that it is
  (service/db/replica.py); otherwise, and whenever the replica fails that statement, on the
  primary. Its audit row goes to the primary either way (the group commit's own pool).

HTTP (service/http/audit.py), MCP (service/mcp/) and jobs open calls; only this module begins,
commits and rolls back a call's transaction, and only audit/rows.py builds its row.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry import trace
from sqlalchemy import (
    ColumnElement,
    Select,
    bindparam,
    cast,
    event,
    func,
    literal,
    literal_column,
    select,
    true,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.sql.selectable import ScalarSelect

from service.audit.group_commit import GroupCommitUnconfirmed
from service.audit.rows import PLATFORM_TENANT, RowSource, append_row
from service.auth.principal import Principal
from service.auth.resolver import (
    EMBEDDED_LIVE,
    TENANT_ENTRANCE,
    Claimed,
    Entrance,
    claimed_caller,
    entrance_check,
    principal_from_check,
    resolve_principal,
)
from service.auth.tokens import VerifiedToken
from service.db.driver import built_once, run
from service.db.replica import PgLsn, ReadReplica
from service.db.tenancy import name_tenant
from service.operations import Operation, answered
from service.problems import Problem, ServiceUnavailable
from service.quotas.limiter import Admission
from service.runtime import Runtime

_log = structlog.get_logger("memgate.calls")

MAX_TARGETS = 1000
"""A row names at most this many target ids (a search answers at most `max_k` hits)."""


NOT_RECORDED = ServiceUnavailable(
    "The call could not be recorded in the audit log, so it was not carried out (nothing was "
    "changed). Retry later."
)
NOT_CONFIRMED = ServiceUnavailable(
    "The database did not confirm the commit of this call and its audit row, so its outcome is "
    "unknown. Read the resource before you retry a write."
)


@dataclass(frozen=True)
class IssuedIdentity:
    """Who a successful token request proved to be (the caller had no bearer token)."""

    tenant_id: uuid.UUID
    subject: str
    principal_id: uuid.UUID
    client_id: str
    token_id: str
    scopes: tuple[str, ...]
    actor_subject: str | None = None
    """The acting agent of a token exchange (`act.sub`)."""


@dataclass
class Facts:
    """What the services found out while the call ran, for its audit row."""

    targets: list[uuid.UUID] = field(default_factory=list)
    result_count: int | None = None
    reason: str | None = None
    issued: IssuedIdentity | None = None
    presented_client_id: str | None = None
    refusal: tuple[int, str] | None = None
    """What the operation refused when its transport answers 200 all the same (a JSON-RPC
    error inside an MCP answer): the status REST would answer, and why."""

    def add_targets(self, ids: Iterable[uuid.UUID]) -> None:
        room = MAX_TARGETS - len(self.targets)
        if room > 0:
            self.targets.extend(list(ids)[:room])

    def count(self, n: int) -> None:
        self.result_count = n

    def refuse(self, status: int, reason: str) -> None:
        self.refusal = (status, reason)

    def client_presented(self, client_id: str | None) -> None:
        """A client id from an unauthenticated token request: kept only when it is a UUID, so
        whatever else a caller types into the field never reaches the log."""
        try:
            self.presented_client_id = str(uuid.UUID(client_id or ""))
        except ValueError:
            self.presented_client_id = None


@dataclass
class Call:
    """One operation's unit of work. `action`, `method` and `route` name it in the audit row;
    the transport may fill them in late (HTTP knows its route only after routing)."""

    runtime: Runtime
    action: str
    method: str
    route: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    caller: Principal | None = None
    token: VerifiedToken | None = None
    bearer: str = ""
    """The bearer token as presented, for naming an untrusted issuer as a digest only."""
    path_ids: list[uuid.UUID] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    started: float = field(default_factory=time.perf_counter)
    exempt: bool = False
    """Probes and scrapes: no audit row (their transaction still ends)."""
    read_only: bool = False
    """A read-only operation (its transaction is read-only; its row is group-committed)."""
    finished: bool = False
    receipt: tuple[uuid.UUID, int, bytes] | None = None
    """(chain, seq, hash) of this call's row once it committed: the chain's head then."""
    admission: Admission | None = None
    """The quotas that let the call in; its concurrency slots go back when it closes."""
    on_replica: bool = False
    """The call's transaction runs on the read replica (its first statement found it fresh)."""
    _session: AsyncSession | None = None
    _sessions: async_sessionmaker[AsyncSession] | None = None
    """Where the call's session comes from: the primary's pool unless routed to the replica."""
    _naming: Claimed | None = None
    """Whom the transaction names for row-level security when it begins."""

    def __post_init__(self) -> None:
        if self.caller is not None:  # made for a known caller (jobs, tests): name it
            self._naming = _ids_of(self.caller)

    def identify(self, caller: Principal, token: VerifiedToken) -> None:
        """The authenticated caller (before the first statement: RLS is named from it)."""
        self.caller, self.token = caller, token
        self._naming = _ids_of(caller)

    async def enter(self, token: VerifiedToken, *, read_only: bool = False) -> Principal:
        """Authenticate the call on its own connection, in its own transaction: the principal,
        client and tenant are checked as still enabled by the transaction's first statements
        (which also read the tenant's settings), so a disabled client or tenant stops at once and
        no second pooled connection is taken.

        The transaction begins naming the ids the verified token claims (its tenant, and for our
        own tokens its subject and acting agent); the resolution then proves them. Only a
        principal mapped from an external subject is named afterwards, once it is known."""
        self.read_only = read_only
        claimed = claimed_caller(token)
        entrance = entrance_check(token)
        replica = self.runtime.replica if read_only else None
        fresh_row = await self._on_fresh_replica(replica, claimed, entrance)
        if entrance is not None:
            principal = await self._enter_in_one_statement(token, claimed, entrance, fresh_row)
        else:
            self._naming = claimed
            principal = await resolve_principal(self.db, token)
            self.identify(principal, token)
            if _ids_of(principal) != claimed:
                await self.db.execute(_NAMING[self.read_only], _naming_params(_ids_of(principal)))
        # Quotas once the caller is known and before any work (429 `rate-limited` otherwise).
        self.admission = await self.runtime.quotas.admit(principal)
        return principal

    async def _on_fresh_replica(
        self, replica: ReadReplica | None, claimed: Claimed, entrance: Entrance | None
    ) -> Any:
        """Route a read-only call to the replica when its first statement (the entrance, or
        for other issuers' tokens the naming) finds it has replayed what the bound requires;
        then the call's session stays there and that statement's row is returned (the entrance
        is not run again). Otherwise the call's session is the primary's, nothing ran yet, and
        this returns None: behind, failing or not configured, the caller never notices."""
        if replica is None:
            return None
        span = trace.get_current_span()
        lsn, reason = replica.required_lsn()
        if lsn is not None:
            self._sessions, self._naming = replica.sessionmaker, None
            statement, params = _fresh_first_statement(claimed, entrance, self.read_only)
            try:
                row = (await self.db.execute(statement, {**params, "fresh_lsn": lsn})).one()
            except SQLAlchemyError as exc:  # refused, unreachable, not our schema: primary
                replica.failed(exc)
                row, reason = None, "replica-failed"
            else:
                reason = _staleness(row.fresh)
                if reason == "not-a-standby":  # misconfigured: do not ask it on every read
                    replica.failed(RuntimeError("MEMGATE_READ_DATABASE_URL is not a standby"))
            if not reason:
                self.on_replica = True
                replica.answered()
                span.set_attribute("memgate.db.route", "replica")
                return row
            await self._drop_session()
        replica.fell_back(reason)
        span.set_attribute("memgate.db.route", "primary")
        span.set_attribute("memgate.db.route.reason", reason)
        return None

    async def _drop_session(self) -> None:
        """Give the replica's connection back (its transaction read nothing kept)."""
        session, self._session, self._sessions = self._session, None, None
        if session is not None:
            try:
                await session.close()
            except Exception as exc:  # a dead connection: the pool discards it
                _log.warning("replica_session_close_failed", error_type=type(exc).__name__)

    async def _enter_in_one_statement(
        self, token: VerifiedToken, claimed: Claimed, entrance: Entrance, row: Any = None
    ) -> Principal:
        """Our own issuer's tokens: the transaction's first statement names the claimed caller
        and, in a scalar subquery after the names, checks the principal and client. Should the
        check ever be evaluated before the names, row-level security would show it no row and
        the call would be refused (closed, never open). `row`: that statement's answer when
        the replica already ran it (with its freshness check)."""
        self._naming = None  # this statement names the caller, not the begin hook
        if row is None:
            params = {**_naming_params(claimed), **entrance.params}
            statement = _entrance_statement(entrance, self.read_only)
            (row,) = await run(self.db, statement, params)
        principal = principal_from_check(token, row.live, row.tenant_settings)
        self.identify(principal, token)
        return principal

    async def name_for(self, tenant_id: uuid.UUID | None) -> None:
        """Work in `tenant_id` from now on (no principal named there), or with None in the
        caller's own tenant again: the platform admin writes a new tenant's first rows. The
        naming holds for the savepoints that follow too (the begin hook names it again)."""
        if self.caller is None:
            raise TypeError("only an authenticated call works in another tenant")
        ids = _ids_of(self.caller) if tenant_id is None else (tenant_id, None, None)
        self._naming = ids
        await self.db.execute(_NAMING[self.read_only], _naming_params(ids))

    @asynccontextmanager
    async def working_in(self, tenant_id: uuid.UUID) -> AsyncIterator[None]:
        """`name_for(tenant_id)` for the block, the caller's own tenant again after it."""
        await self.name_for(tenant_id)
        try:
            yield
        finally:
            await self.name_for(None)

    @property
    def authenticated(self) -> bool:
        return self.caller is not None and self.token is not None

    @property
    def db(self) -> AsyncSession:
        """The call's session. No connection is taken until its first statement, and the
        transaction that statement begins names the caller first."""
        if self._session is None:
            self._session = (self._sessions or self.runtime.sessionmaker)()
            event.listen(self._session.sync_session, "after_begin", self._name_caller)
        return self._session

    def _name_caller(self, _: Session, __: SessionTransaction, connection: Connection) -> None:
        if self._naming is not None:
            connection.execute(_NAMING[self.read_only], _naming_params(self._naming))

    def chain(self) -> uuid.UUID:
        """The chain the row goes to: the caller's tenant, the tenant a token request proved,
        or the platform chain (calls nobody authenticated are never logged under the tenant a
        token merely claims)."""
        if self.caller is not None and self.token is not None:
            return self.caller.tenant_id
        if self.facts.issued is not None:
            return self.facts.issued.tenant_id
        return PLATFORM_TENANT

    async def finish(self, status: int, reason: str | None = None) -> ServiceUnavailable | None:
        """Record the call. A problem means it could not be (answer that instead)."""
        self.finished = True
        if status < 400 and self.facts.refusal is not None:
            status, reason = self.facts.refusal
        if reason is not None:
            self.facts.reason = reason
        session = self._session
        began = session is not None and session.in_transaction()
        if self.exempt:
            await self._settle(commit=status < 400)
            return None
        if status < 400 and began and self.read_only:
            return await self._grouped(status)
        if status < 400 and began:
            assert session is not None
            return await self._with_the_call(session, status)
        # Denied, failed or no database work: nothing of the call is kept, so its row needs no
        # transaction of its own either (under a flood of refusals, one fsync per refusal was
        # most of what refusing cost).
        await self._settle(commit=False)
        return await self._grouped(status)

    async def _with_the_call(self, session: AsyncSession, status: int) -> ServiceUnavailable | None:
        """The row in the call's own transaction, committed with the call's writes."""
        source = RowSource.of(self, status, None)
        try:
            if self.caller is None:
                # `audit_append()` writes only to the tenant the transaction names; a call with
                # a caller named it when it began, and keeps it.
                await name_tenant(session, self.chain())
            self.receipt = await append_row(session, self.runtime, source, path="in_request")
        except Exception as exc:  # any failure: the call must not succeed unrecorded
            self.receipt = None
            _log.error("audit_in_request_failed", error_type=type(exc).__name__)
            await self._settle(commit=False)
            await self._separately(503, "audit-unavailable")
            return NOT_RECORDED
        try:
            await session.commit()
        except Exception as exc:  # the reply to COMMIT was lost or refused: outcome unknown
            self.receipt = None
            _log.error("audit_commit_failed", error_type=type(exc).__name__)
            await self._separately(503, "commit-unconfirmed")
            return NOT_CONFIRMED
        if self.runtime.replica is not None:  # this process's later reads must see it
            self.runtime.replica.wrote()
        return None

    async def _grouped(self, status: int) -> ServiceUnavailable | None:
        """The row of a call that keeps nothing (a read, or a call rolled back), committed with
        other such calls' rows before the answer. A read's own transaction changed nothing; it
        ends when the call closes, after the answer.

        If the group fails, the read's connection goes back first (its work is done), so reads
        falling back together never hold the pool they wait on; a group whose COMMIT was not
        confirmed is not appended again (the rows may be there): the call answers 503 as an
        unconfirmed write does, and that is audited on its own."""
        try:
            self.receipt = await self.runtime.read_audit.append(
                self.runtime, RowSource.of(self, status, None)
            )
            return None
        except GroupCommitUnconfirmed:
            _log.error("audit_group_commit_unconfirmed")
            await self._settle(commit=False)
            await self._separately(503, "commit-unconfirmed")
            return NOT_CONFIRMED
        except Exception as exc:  # the group failed: try the row on its own
            _log.error("audit_group_failed", error_type=type(exc).__name__)
        await self._settle(commit=False)
        return None if await self._separately(status, None) else NOT_RECORDED

    async def _separately(self, status: int, reason: str | None) -> bool:
        source = RowSource.of(self, status, reason)
        try:
            async with (
                self._platform_slot(source.tenant_id),
                self.runtime.sessionmaker.begin() as session,
            ):
                await name_tenant(session, source.tenant_id)
                receipt = await append_row(session, self.runtime, source, path="separate")
            self.receipt = receipt
            return True
        except Exception as exc:  # reported to the caller as 503
            _log.error("audit_append_failed", error_type=type(exc).__name__)
            return False

    def _platform_slot(self, tenant: uuid.UUID) -> AbstractAsyncContextManager[Any]:
        """Rows of calls nobody authenticated all go to the platform tenant's chain, whose lock
        appends them one at a time. A flood of refused token requests would otherwise hold a
        pool connection per row just to wait for that lock, so they take one of a few slots
        *before* checking a connection out; rows of other chains do not wait."""
        if tenant != PLATFORM_TENANT:
            return nullcontext()
        return self.runtime.platform_audit_slots

    async def _settle(self, *, commit: bool) -> None:
        """End the call's transaction; a failure to roll back (a dead connection) must not stop
        the call being audited, and what was not committed is gone either way."""
        session = self._session
        if session is None or not session.in_transaction():
            return
        try:
            if commit:
                await session.commit()
            else:
                await session.rollback()
        except Exception as exc:
            _log.error("call_transaction_end_failed", error_type=type(exc).__name__)
            if commit:
                raise

    async def release(self) -> None:
        """End the call's transaction early and give its connection back (nothing it did is
        kept): an MCP exchange whose tool calls run as calls of their own holds no connection
        while they run. A later statement would begin a new transaction."""
        await self._settle(commit=False)

    async def close(self) -> None:
        if self.admission is not None:
            await self.admission.release()
        if self._session is not None:
            if self.read_only and self.finished:
                await self._settle_read()
            await self._session.close()

    async def _settle_read(self) -> None:
        """End a read-only transaction with COMMIT, not the ROLLBACK closing would send: the
        database refuses every write in it, so the two keep the same (nothing), but psycopg
        forgets all of a connection's prepared statements on ROLLBACK, and the next reads on it
        would parse and plan their statements again (docs/architecture.md, "Prepared
        statements"). A transaction that failed ends as a rollback either way."""
        session = self._session
        if session is None or not session.in_transaction():
            return
        try:
            await session.commit()
        except Exception as exc:  # a dead connection: closing discards it
            _log.warning("read_transaction_end_failed", error_type=type(exc).__name__)


def _ids_of(caller: Principal) -> Claimed:
    return caller.tenant_id, caller.principal_id, caller.actor_id


def _naming_columns(read_only: bool) -> list[ColumnElement[Any]]:
    """The one way a call names its caller: transaction-local settings the row-level security
    policies read (no principal: ''), and for a read-only operation a read-only transaction.
    The values are bound (`_naming_params`), so the statements are built once."""
    settings: list[tuple[str, ColumnElement[Any]]] = [
        ("memgate.tenant_id", bindparam("named_tenant")),
        ("memgate.principal_id", bindparam("named_principal")),
        ("memgate.actor_id", bindparam("named_actor")),
    ]
    if read_only:
        settings.append(("transaction_read_only", literal("on")))
    return [func.set_config(literal_column(f"'{name}'"), value, true()) for name, value in settings]


def _naming_params(ids: Claimed) -> dict[str, str]:
    tenant, principal, actor = ids
    return {
        "named_tenant": str(tenant),
        "named_principal": str(principal) if principal else "",
        "named_actor": str(actor) if actor else "",
    }


_NAMING = {read_only: select(*_naming_columns(read_only)) for read_only in (False, True)}
"""The naming statement of a read-write and of a read-only call."""


def _entrance_statement(entrance: Entrance, read_only: bool) -> Select[Any]:
    """The entrance's one statement: the names first, then the check, then the tenant."""
    if entrance.prebuilt:
        return _PLAIN_ENTRANCE[read_only]
    return _entrance_of(entrance.check, read_only)


def _entrance_of(check: ScalarSelect[Any], read_only: bool) -> Select[Any]:
    return select(
        *_naming_columns(read_only),
        check.label("live"),
        TENANT_ENTRANCE.label("tenant_settings"),
    )


_PLAIN_ENTRANCE = {
    read_only: built_once(_entrance_of(EMBEDDED_LIVE, read_only)) for read_only in (False, True)
}
"""The entrance of a plain token of our own issuer (most calls), built once: on the driver."""


def _staleness(fresh: bool | None) -> str:
    """Why a replica's answer to the freshness column rules it out ('' when it does not)."""
    if fresh is None:  # pg_last_wal_replay_lsn() is NULL outside recovery
        return "not-a-standby"
    return "" if fresh else "behind"


_FRESH = (func.pg_last_wal_replay_lsn() >= cast(bindparam("fresh_lsn"), PgLsn())).label("fresh")
"""On the replica: has it replayed the primary's WAL up to `fresh_lsn`? (NULL on a primary.)"""


def _fresh_first_statement(
    claimed: Claimed, entrance: Entrance | None, read_only: bool
) -> tuple[Select[Any], dict[str, Any]]:
    """A routed call's first statement: the one it runs anyway (the entrance, or the naming
    for other issuers' tokens) with the replica's freshness as one more column."""
    params: dict[str, Any] = dict(_naming_params(claimed))
    if entrance is None:
        return _NAMING[read_only].add_columns(_FRESH), params
    params.update(entrance.params)
    return _entrance_statement(entrance, read_only).add_columns(_FRESH), params


@asynccontextmanager
async def open_call(
    runtime: Runtime,
    operation: Operation,
    *,
    token: VerifiedToken,
    caller: Principal | None = None,
    method: str,
    route: str,
    request_id: str | None = None,
) -> AsyncIterator[Call]:
    """A call outside HTTP's response cycle (an MCP tool, a job), authenticated from `token`
    in its own transaction unless the transport already resolved `caller`. It finishes when
    the block ends — committed with its audit row when the block returned, rolled back and
    audited as a denial (a `Problem`) or failure otherwise — before the caller sees any result.
    A call that cannot be recorded raises `ServiceUnavailable`."""
    call = Call(runtime, operation.name, method, route)
    if request_id is not None:
        call.request_id = request_id
    try:
        try:
            if caller is not None:  # authenticated by the transport already
                call.read_only = operation.read_only
                call.identify(caller, token)
            else:
                await call.enter(token, read_only=operation.read_only)
            yield call
        except Problem as problem:
            answered(operation, problem.type_uri())
            if await call.finish(problem.status, problem.slug) is not None:
                raise NOT_RECORDED from problem
            raise
        except BaseException:
            await call.finish(500, "internal-error")
            raise
        unrecorded = await call.finish(operation.success)
        if unrecorded is not None:
            raise unrecorded
    finally:
        await call.close()
