"""How many statements a write and a search send (issue 10, "the hot path"): each one is a
round trip on a busy box, so the counts are a contract. Counted with a `before_cursor_execute`
listener on the service's own connection, after the caller is named (which the call does)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Call, Facts
from service.memory.schemas import MemoryCreate, SearchRequest
from service.memory.service import MemoryService
from tests.fixtures.api import Agent, Api


def _caller(api: Api, agent: Agent) -> Principal:
    return Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(agent.principal_id),
        client_id=agent.client_id,
        scopes=frozenset({"read:memory", "write:memory"}),
        token_id="test",
        issuer="test",
    )


@asynccontextmanager
async def _service(api: Api, caller: Principal) -> AsyncIterator[tuple[MemoryService, list[str]]]:
    """A service on a named caller's session, and the statements it sends from here on."""
    session: AsyncSession = Call(api.runtime, "memory.test", "POST", "/t", caller=caller).db
    sent: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    connection = (await session.connection()).sync_connection
    assert connection is not None
    event.listen(connection, "before_cursor_execute", count)
    try:
        memories = MemoryService(
            session, api.runtime.embedder, api.runtime.settings.memory, facts=Facts()
        )
        yield memories, sent
    finally:
        event.remove(connection, "before_cursor_execute", count)
        await session.rollback()
        await session.close()


async def test_a_write_sends_six_statements(api: Api) -> None:
    """Where the caller may write (grants, personal space, space settings), the subject and
    key locks (and the revocation lock, shared) with the clock, the write gate's look at the
    subject's live keys (issue 12), the standing revocations that cover it (issue 15: after
    the lock, so in a statement of its own), the newest version with the supersession, the
    insert."""
    alice = await api.new_agent("alice")
    await api.remember(alice, key="deploy.window", value="Tuesdays")
    caller = _caller(api, alice)
    async with _service(api, caller) as (service, sent):
        data = MemoryCreate(subject="service:billing", kind="fact", key="deploy.window",
                            value="Thursdays")  # fmt: skip
        written = await service.write(caller, data)
        assert written.memory.version == 2
        assert len(written.superseded) == 1
        assert len(sent) == 6, sent


async def test_a_fresh_key_is_written_in_six_statements_too(api: Api) -> None:
    alice = await api.new_agent("alice")
    caller = _caller(api, alice)
    async with _service(api, caller) as (service, sent):
        data = MemoryCreate(subject="service:billing", kind="fact", key="new", value="first")
        written = await service.write(caller, data)
        assert (written.memory.version, written.superseded) == (1, [])
        assert len(sent) == 6, sent


async def test_new_key_skips_the_gate_statement(api: Api) -> None:
    """`new_key: true` (or a space with the gate off) skips the gate's statement: five (the
    four of before the gate, and the revocation lookup of issue 15), no subject lock, no look
    at the subject's keys."""
    alice = await api.new_agent("alice")
    await api.remember(alice, key="deploy.window", value="Tuesdays")
    caller = _caller(api, alice)
    async with _service(api, caller) as (service, sent):
        data = MemoryCreate(subject="service:billing", kind="fact", key="deploy.freeze",
                            value="Fridays", new_key=True)  # fmt: skip
        written = await service.write(caller, data)
        assert (written.memory.version, written.superseded) == (1, [])
        assert len(sent) == 5, sent


async def test_a_search_sends_two_statements(api: Api) -> None:
    """The read budget, then one statement that ranks, fetches the answer and restores the
    budget for whatever the call runs next."""
    alice = await api.new_agent("alice")
    for n in range(12):
        await api.remember(alice, key=f"k{n}", value=f"billing fact number {n}")
    caller = _caller(api, alice)
    async with _service(api, caller) as (service, sent):
        found = await service.search(caller, SearchRequest(query="billing fact", k=10))
        assert len(found.hits) == 10
        assert len(sent) == 2, sent


async def test_a_history_page_is_one_statement_after_the_budget(api: Api) -> None:
    """Issue 12: both walks of a history (forward to the newest visible version, back from
    it) and the answer's columns are one statement; the read budget is set before it and
    restored by it."""
    alice = await api.new_agent("alice")
    chain = [await api.remember(alice, key="deploy.window", value=f"v{n}") for n in range(4)]
    caller = _caller(api, alice)
    async with _service(api, caller) as (service, sent):
        history = await service.history(caller, uuid.UUID(chain[1]["id"]), None, 3)
        assert [item.version for item in history.items] == [4, 3, 2]
        assert history.next_cursor is not None
        assert len(sent) == 2, sent
