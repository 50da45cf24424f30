"""The asynchronous client, `AsyncMemgate`. `_sync.py` is generated from `_async.py` by
`clients/python/unasync.py`: edit `_async.py`, then run the script (a test checks they agree)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack, cast

import httpx

from memgate_client import _endpoints as E
from memgate_client._common import (
    USER_AGENT,
    Cursors,
    audit_export_of,
    decoded,
    new_idempotency_key,
    next_seq_after,
    query,
    receipt_of,
    redirect_refused,
    token_answer,
    token_was_rejected,
    url_of,
)
from memgate_client.credentials import CachedToken, ClientCredentials, Credentials, TokenExchange
from memgate_client.errors import MemgateConnectionError, problem_from_response
from memgate_client.retry import RetryPolicy
from memgate_client.types import (
    Action,
    AuditEvent,
    AuditExport,
    AuditPage,
    AuditReceipt,
    AuditVerification,
    BatchWritten,
    Checkpoint,
    Client,
    ClientCreate,
    ClientCreated,
    Decision,
    GroupBy,
    JobRun,
    JobRunPage,
    Kind,
    Limits,
    Memory,
    MemoryCounts,
    MemoryCreate,
    MemoryPage,
    MemoryWritten,
    PolicyChange,
    Principal,
    PrincipalCreate,
    RoleGrant,
    RunCreate,
    SearchRequest,
    SearchResult,
    Space,
    SpaceAccess,
    SpaceCreate,
    SpaceCreated,
    Team,
    TeamCreate,
    Tenant,
    TenantCreate,
    TenantCreated,
    TenantLimits,
    TenantPage,
    TokenResponse,
)


class _AsyncTokens:
    """The cached token of one set of credentials, replaced before it expires; one fetch at
    a time (callers that find it stale while a fetch runs wait for that fetch)."""

    def __init__(
        self, client: AsyncMemgate, credentials: Credentials, clock: Callable[[], float]
    ) -> None:
        self._client = client
        self._credentials = credentials
        self._clock = clock
        self._lock = asyncio.Lock()
        self._cached: CachedToken | None = None
        self._subject: _AsyncTokens | None = None
        if isinstance(credentials, TokenExchange) and isinstance(
            credentials.subject, ClientCredentials
        ):
            self._subject = _AsyncTokens(client, credentials.subject, clock)

    def _fresh(self) -> str | None:
        cached = self._cached
        if cached is not None and self._clock() < cached.refresh_at:
            return cached.token
        return None

    async def get(self) -> str:
        if (token := self._fresh()) is not None:
            return token
        async with self._lock:
            if (token := self._fresh()) is not None:  # another caller fetched it meanwhile
                return token
            answer = await self.fetch()
            return answer["access_token"]

    async def fetch(self) -> TokenResponse:
        """A new token now (the caller holds the lock, or wants one regardless)."""
        asked_at = self._clock()
        credentials = self._credentials
        if isinstance(credentials, TokenExchange):
            subject = credentials.subject
            subject_token = subject if isinstance(subject, str) else await self._subject_token()
            form = credentials.form(subject_token)
        else:
            form = credentials.form()
        auth = (credentials.client_id, credentials.client_secret)
        answer = await self._client._token_request(form, auth)
        self._cached = CachedToken.issued(answer["access_token"], answer["expires_in"], asked_at)
        return answer

    async def _subject_token(self) -> str:
        assert self._subject is not None
        return await self._subject.get()

    def invalidate(self, token: str) -> None:
        """The server refused `token`: forget it (unless a newer one replaced it already),
        and the user's token it was exchanged from (the reason may be there)."""
        if self._cached is not None and self._cached.token == token:
            self._cached = None
            if self._subject is not None:
                self._subject._cached = None


class AsyncMemgate:
    """memgate's API, asynchronously: `async with AsyncMemgate(url, credentials=...) as mg:`.

    credentials: `ClientCredentials` or `TokenExchange`; tokens are fetched on first use,
        replaced before they expire, and once more when the server rejects one (401
        `invalid_token`, e.g. clocks apart). `token`: a fixed bearer token instead (never
        renewed). Neither: anonymous (every API call answers 401).
    retry: retries of idempotent requests (GET, PUT, DELETE, the token endpoint, the batch
        write with its `Idempotency-Key`) after dropped connections and 429/502/503/504.
    http: your own `httpx.AsyncClient` (proxies, TLS, event hooks); not closed by `aclose`.
    clock: what token lifetimes are measured with (monotonic seconds).
    audit_receipts: ask for an `Audit-Receipt` on every call (`Prefer: audit-receipt`); the
        newest is `last_receipt`, a head `verify_audit_head` holds the log to.
    """

    def __init__(
        self,
        base_url: str,
        *,
        credentials: Credentials | None = None,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        audit_receipts: bool = False,
    ) -> None:
        if credentials is not None and token is not None:
            raise ValueError("give credentials or a token, not both")
        self.base_url = base_url.rstrip("/")
        self._retry = retry if retry is not None else RetryPolicy()
        self._own_http = http is None
        self._http = http if http is not None else httpx.AsyncClient(timeout=timeout)
        self._token = token
        self._tokens = _AsyncTokens(self, credentials, clock) if credentials else None
        self._receipts = audit_receipts
        self.last_receipt: AuditReceipt | None = None
        """The newest `Audit-Receipt` (with `audit_receipts=True`)."""

    async def __aenter__(self) -> AsyncMemgate:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    # --- the transport ----------------------------------------------------------------------

    async def _bearer(self) -> str | None:
        if self._tokens is not None:
            return await self._tokens.get()
        return self._token

    async def _send(
        self,
        endpoint: E.Endpoint,
        ids: Mapping[str, str] | None = None,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        form: Mapping[str, str] | None = None,
        basic: tuple[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """Send once, and again while the retry policy allows; the answer, or its problem
        raised."""
        url = url_of(self.base_url, endpoint, ids)
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if endpoint.keyed:
            headers["Idempotency-Key"] = idempotency_key or new_idempotency_key()
        if self._receipts and endpoint.authenticated:
            headers["Prefer"] = "audit-receipt"
        sent, renewed = 0, False
        while True:
            bearer = await self._bearer() if endpoint.authenticated else None
            if bearer is not None:
                headers["Authorization"] = f"Bearer {bearer}"
            try:
                response = await self._http.request(
                    endpoint.method,
                    url,
                    json=json,
                    params=params,
                    data=form,
                    headers=headers,
                    auth=basic if basic is not None else httpx.USE_CLIENT_DEFAULT,
                    follow_redirects=False,
                )
            except httpx.TransportError as exc:
                sent += 1
                wait = self._retry.after_error(sent, endpoint.retryable)
                if wait is None:
                    raise MemgateConnectionError(
                        f"{endpoint.method} {endpoint.path} failed after {sent} attempt(s): "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                await asyncio.sleep(wait)
                continue
            sent += 1
            if 300 <= response.status_code < 400:
                raise redirect_refused(response)
            if self._receipts and (receipt := receipt_of(response)) is not None:
                self.last_receipt = receipt
            if response.is_success:
                return response
            if (
                bearer is not None
                and self._tokens is not None
                and not renewed
                and token_was_rejected(response)
            ):
                # Refused at authentication, before any work: safe to send again, once.
                self._tokens.invalidate(bearer)
                renewed = True
                continue
            wait = self._retry.after_answer(sent, endpoint.retryable, response)
            if wait is None:
                raise problem_from_response(response)
            await asyncio.sleep(wait)

    async def _json(
        self,
        endpoint: E.Endpoint,
        ids: Mapping[str, str] | None = None,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        response = await self._send(
            endpoint, ids, json=json, params=params, idempotency_key=idempotency_key
        )
        return decoded(response)

    async def _token_request(
        self, form: Mapping[str, str], basic: tuple[str, str]
    ) -> TokenResponse:
        return token_answer(await self._send(E.ISSUE_TOKEN, form=form, basic=basic))

    # --- tokens -----------------------------------------------------------------------------

    async def issue_token(self) -> TokenResponse:
        """A new access token for the client's credentials (it becomes the cached one)."""
        if self._tokens is None:
            raise ValueError("this client has no credentials to get a token with")
        return await self._tokens.fetch()

    # --- memories ---------------------------------------------------------------------------

    async def write_memory(self, **memory: Unpack[MemoryCreate]) -> MemoryWritten:
        """Learn one memory (a new version when subject, kind and key exist). Never retried: a
        plain write has no idempotency key, so a lost answer may hide a done write."""
        return cast(MemoryWritten, await self._json(E.WRITE_MEMORY, json=memory))

    async def write_memory_batch(
        self, items: Sequence[MemoryCreate], *, idempotency_key: str | None = None
    ) -> BatchWritten:
        """Learn 1..500 memories in one transaction, all or nothing (`BatchRejected` lists
        every bad item). Always sent with an `Idempotency-Key` (yours, or one made for this
        call), the same on every retry, so a retry after a lost answer gets the stored one."""
        body = {"items": list(items)}
        answer = await self._json(E.WRITE_MEMORY_BATCH, json=body, idempotency_key=idempotency_key)
        return cast(BatchWritten, answer)

    async def get_memory(
        self, memory_id: str, *, as_of: str | None = None, known_at: str | None = None
    ) -> Memory:
        params = query(as_of=as_of, known_at=known_at)
        return cast(Memory, await self._json(E.GET_MEMORY, {"memory_id": memory_id}, params=params))

    async def list_memories(
        self,
        *,
        subject: str | None = None,
        kind: Kind | None = None,
        key: str | None = None,
        space_id: str | None = None,
        as_of: str | None = None,
        known_at: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> MemoryPage:
        params = query(
            subject=subject,
            kind=kind,
            key=key,
            space_id=space_id,
            as_of=as_of,
            known_at=known_at,
            cursor=cursor,
            limit=limit,
        )
        return cast(MemoryPage, await self._json(E.LIST_MEMORIES, params=params))

    async def iter_memories(
        self,
        *,
        subject: str | None = None,
        kind: Kind | None = None,
        key: str | None = None,
        space_id: str | None = None,
        as_of: str | None = None,
        known_at: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Memory]:
        """Every memory `list_memories` would page through, page after page."""
        cursor: str | None = None
        cursors = Cursors()
        while True:
            page = await self.list_memories(
                subject=subject,
                kind=kind,
                key=key,
                space_id=space_id,
                as_of=as_of,
                known_at=known_at,
                cursor=cursor,
                limit=limit,
            )
            for memory in page["items"]:
                yield memory
            cursor = cursors.next(page["next_cursor"])
            if cursor is None:
                return

    async def search_memories(self, **request: Unpack[SearchRequest]) -> SearchResult:
        """Recall: hybrid search under the caller's visibility (POST, but a read: retried)."""
        return cast(SearchResult, await self._json(E.SEARCH_MEMORIES, json=request))

    async def count_memories(
        self,
        *,
        subject: str | None = None,
        kind: Kind | None = None,
        key: str | None = None,
        space_id: str | None = None,
        as_of: str | None = None,
        known_at: str | None = None,
        group_by: GroupBy | None = None,
    ) -> MemoryCounts:
        params = query(
            subject=subject,
            kind=kind,
            key=key,
            space_id=space_id,
            as_of=as_of,
            known_at=known_at,
            group_by=group_by,
        )
        return cast(MemoryCounts, await self._json(E.COUNT_MEMORIES, params=params))

    async def get_memory_history(
        self,
        memory_id: str,
        *,
        as_of: str | None = None,
        known_at: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> MemoryPage:
        params = query(as_of=as_of, known_at=known_at, cursor=cursor, limit=limit)
        ids = {"memory_id": memory_id}
        return cast(MemoryPage, await self._json(E.GET_MEMORY_HISTORY, ids, params=params))

    async def iter_memory_history(
        self,
        memory_id: str,
        *,
        as_of: str | None = None,
        known_at: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Memory]:
        """The supersession chain, every page of it (it stops at the first invisible hop)."""
        cursor: str | None = None
        cursors = Cursors()
        while True:
            page = await self.get_memory_history(
                memory_id, as_of=as_of, known_at=known_at, cursor=cursor, limit=limit
            )
            for memory in page["items"]:
                yield memory
            cursor = cursors.next(page["next_cursor"])
            if cursor is None:
                return

    async def revert_memory(self, memory_id: str) -> MemoryWritten:
        """Write an earlier version's value again as the new live version."""
        answer = await self._json(E.REVERT_MEMORY, {"memory_id": memory_id})
        return cast(MemoryWritten, answer)

    async def delete_memory(self, memory_id: str) -> None:
        """Forget a memory (204). Retried like every DELETE: a retry after a lost answer may
        answer `MemoryNotFound` for a memory the first attempt deleted."""
        await self._send(E.DELETE_MEMORY, {"memory_id": memory_id})

    # --- principals and clients -------------------------------------------------------------

    async def create_principal(self, **principal: Unpack[PrincipalCreate]) -> Principal:
        return cast(Principal, await self._json(E.CREATE_PRINCIPAL, json=principal))

    async def list_principals(self) -> list[Principal]:
        return cast(list[Principal], (await self._json(E.LIST_PRINCIPALS))["items"])

    async def get_principal(self, principal_id: str) -> Principal:
        ids = {"principal_id": principal_id}
        return cast(Principal, await self._json(E.GET_PRINCIPAL, ids))

    async def allow_delegate(self, principal_id: str, agent_id: str) -> None:
        """Let the agent act for the user by token exchange (needs `manage:delegates`)."""
        await self._send(E.ALLOW_DELEGATE, {"principal_id": principal_id, "agent_id": agent_id})

    async def revoke_delegate(self, principal_id: str, agent_id: str) -> None:
        await self._send(E.REVOKE_DELEGATE, {"principal_id": principal_id, "agent_id": agent_id})

    async def grant_tenant_role(self, principal_id: str, role: str) -> RoleGrant:
        ids = {"principal_id": principal_id, "role": role}
        return cast(RoleGrant, await self._json(E.GRANT_TENANT_ROLE, ids))

    async def create_client(self, **client: Unpack[ClientCreate]) -> ClientCreated:
        """Register a client; the answer holds its secret, shown this once."""
        return cast(ClientCreated, await self._json(E.CREATE_CLIENT, json=client))

    async def list_clients(self) -> list[Client]:
        return cast(list[Client], (await self._json(E.LIST_CLIENTS))["items"])

    async def get_client(self, client_id: str) -> Client:
        return cast(Client, await self._json(E.GET_CLIENT, {"client_id": client_id}))

    async def disable_client(self, client_id: str) -> Client:
        return cast(Client, await self._json(E.DISABLE_CLIENT, {"client_id": client_id}))

    # --- spaces, teams, grants --------------------------------------------------------------

    async def create_space(self, **space: Unpack[SpaceCreate]) -> SpaceCreated:
        return cast(SpaceCreated, await self._json(E.CREATE_SPACE, json=space))

    async def list_spaces(self) -> list[Space]:
        return cast(list[Space], (await self._json(E.LIST_SPACES))["items"])

    async def get_space_access(self, space_id: str, action: Action) -> SpaceAccess:
        ids = {"space_id": space_id, "action": action}
        return cast(SpaceAccess, await self._json(E.GET_SPACE_ACCESS, ids))

    async def grant_space_access(self, space_id: str, action: Action, subject: str) -> PolicyChange:
        """Grant `action` on the space to `subject` (`user:<id>`, `team:<id>`, `role:<name>`)."""
        ids = {"space_id": space_id, "action": action, "subject": subject}
        return cast(PolicyChange, await self._json(E.GRANT_SPACE_ACCESS, ids))

    async def revoke_space_access(
        self, space_id: str, action: Action, subject: str
    ) -> PolicyChange:
        ids = {"space_id": space_id, "action": action, "subject": subject}
        return cast(PolicyChange, await self._json(E.REVOKE_SPACE_ACCESS, ids))

    async def create_team(self, **team: Unpack[TeamCreate]) -> Team:
        return cast(Team, await self._json(E.CREATE_TEAM, json=team))

    async def list_teams(self) -> list[Team]:
        return cast(list[Team], (await self._json(E.LIST_TEAMS))["items"])

    async def add_team_member(self, team_id: str, member: str) -> PolicyChange:
        ids = {"team_id": team_id, "member": member}
        return cast(PolicyChange, await self._json(E.ADD_TEAM_MEMBER, ids))

    async def remove_team_member(self, team_id: str, member: str) -> PolicyChange:
        ids = {"team_id": team_id, "member": member}
        return cast(PolicyChange, await self._json(E.REMOVE_TEAM_MEMBER, ids))

    # --- audit ------------------------------------------------------------------------------

    async def list_audit_events(
        self,
        *,
        since: str | None = None,
        until: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        decision: Decision | None = None,
        target: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> AuditPage:
        """Your tenant's audit events, newest first (needs `read:audit` and the auditor role)."""
        params = query(
            since=since,
            until=until,
            actor=actor,
            action=action,
            decision=decision,
            target=target,
            cursor=cursor,
            limit=limit,
        )
        return cast(AuditPage, await self._json(E.LIST_AUDIT_EVENTS, params=params))

    async def iter_audit_events(
        self,
        *,
        since: str | None = None,
        until: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        decision: Decision | None = None,
        target: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[AuditEvent]:
        cursor: str | None = None
        cursors = Cursors()
        while True:
            page = await self.list_audit_events(
                since=since,
                until=until,
                actor=actor,
                action=action,
                decision=decision,
                target=target,
                cursor=cursor,
                limit=limit,
            )
            for event in page["items"]:
                yield event
            cursor = cursors.next(page["next_cursor"])
            if cursor is None:
                return

    async def export_audit_events(
        self, *, from_seq: int | None = None, limit: int | None = None
    ) -> AuditExport:
        """One export page, oldest first, with `prev_hash`/`row_hash`; `next_seq` continues."""
        params = query(from_seq=from_seq, limit=limit)
        return audit_export_of(await self._send(E.EXPORT_AUDIT_EVENTS, params=params))

    async def iter_audit_export(
        self, *, from_seq: int = 1, limit: int | None = None
    ) -> AsyncIterator[AuditEvent]:
        """Every event from `from_seq` on, following `Audit-Next-Seq`."""
        next_seq: int | None = from_seq
        while next_seq is not None:
            page = await self.export_audit_events(from_seq=next_seq, limit=limit)
            for event in page["events"]:
                yield event
            next_seq = next_seq_after(next_seq, page["next_seq"])

    async def verify_audit_chain(
        self,
        *,
        from_seq: int | None = None,
        to_seq: int | None = None,
        known_seq: int | None = None,
        known_hash: str | None = None,
    ) -> AuditVerification:
        """Recompute the chain in the database; with `known_seq`/`known_hash` (a head you
        kept: a checkpoint or an `Audit-Receipt`) the chain must still hold that row."""
        params = query(from_seq=from_seq, to_seq=to_seq, known_seq=known_seq, known_hash=known_hash)
        return cast(AuditVerification, await self._json(E.VERIFY_AUDIT_CHAIN, params=params))

    async def verify_audit_head(self, receipt: AuditReceipt | None = None) -> AuditVerification:
        """`verify_audit_chain` against a head you hold: `receipt`, or this client's
        `last_receipt`. A tail cut after it (or rewritten) answers `ok: false`."""
        held = receipt if receipt is not None else self.last_receipt
        if held is None:
            raise ValueError("no receipt: pass one, or make calls with audit_receipts=True")
        return await self.verify_audit_chain(known_seq=held["seq"], known_hash=held["hash"])

    async def get_latest_checkpoint(self) -> Checkpoint:
        return cast(Checkpoint, await self._json(E.GET_LATEST_CHECKPOINT))

    # --- jobs -------------------------------------------------------------------------------

    async def start_job_run(self, name: str, **run: Unpack[RunCreate]) -> JobRun:
        """Queue a run of a job (`memory.sweep_expired`, `memory.consolidate` ...); 202."""
        return cast(JobRun, await self._json(E.START_JOB_RUN, {"name": name}, json=run))

    async def get_job_run(self, run_id: str) -> JobRun:
        return cast(JobRun, await self._json(E.GET_JOB_RUN, {"run_id": run_id}))

    async def list_job_runs(
        self, *, status: str | None = None, cursor: str | None = None
    ) -> JobRunPage:
        params = query(status=status, cursor=cursor)
        return cast(JobRunPage, await self._json(E.LIST_JOB_RUNS, params=params))

    async def iter_job_runs(self, *, status: str | None = None) -> AsyncIterator[JobRun]:
        cursor: str | None = None
        cursors = Cursors()
        while True:
            page = await self.list_job_runs(status=status, cursor=cursor)
            for run in page["items"]:
                yield run
            cursor = cursors.next(page["next_cursor"])
            if cursor is None:
                return

    # --- tenants (the platform admin) -------------------------------------------------------

    async def create_tenant(self, **tenant: Unpack[TenantCreate]) -> TenantCreated:
        """A new tenant and its first admin (whose secret the answer shows this once)."""
        return cast(TenantCreated, await self._json(E.CREATE_TENANT, json=tenant))

    async def list_tenants(
        self, *, cursor: str | None = None, limit: int | None = None
    ) -> TenantPage:
        params = query(cursor=cursor, limit=limit)
        return cast(TenantPage, await self._json(E.LIST_TENANTS, params=params))

    async def iter_tenants(self, *, limit: int | None = None) -> AsyncIterator[Tenant]:
        cursor: str | None = None
        cursors = Cursors()
        while True:
            page = await self.list_tenants(cursor=cursor, limit=limit)
            for tenant in page["items"]:
                yield tenant
            cursor = cursors.next(page["next_cursor"])
            if cursor is None:
                return

    async def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, await self._json(E.GET_TENANT, {"tenant_id": tenant_id}))

    async def get_tenant_limits(self, tenant_id: str) -> TenantLimits:
        """The tenant's quotas, its clients' and what it stores now."""
        ids = {"tenant_id": tenant_id}
        return cast(TenantLimits, await self._json(E.GET_TENANT_LIMITS, ids))

    async def set_tenant_limits(self, tenant_id: str, **limits: Unpack[Limits]) -> Limits:
        """Replace the tenant's quotas (none given: remove them)."""
        ids = {"tenant_id": tenant_id}
        return cast(Limits, await self._json(E.SET_TENANT_LIMITS, ids, json=limits))

    async def set_client_limits(
        self, tenant_id: str, client_id: str, **limits: Unpack[Limits]
    ) -> Limits:
        """Replace one client's quotas (requests, concurrency, token requests)."""
        ids = {"tenant_id": tenant_id, "client_id": client_id}
        return cast(Limits, await self._json(E.SET_CLIENT_LIMITS, ids, json=limits))
