"""Last recall (issue 13): a search or get notes the ids it answered in memory only; a batch
writes them per tenant at a day's resolution; the read sends no statement more."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Call, Facts
from service.memory.recalls import RecallLog, today
from service.memory.schemas import SearchRequest
from service.memory.service import MemoryService
from service.settings import RecallSettings
from tests.fixtures.api import Api
from tests.integration.jobs.batch_support import agent_principal
from tests.integration.memory.support import as_owner


async def recalled(api: Api) -> dict[str, object]:
    """What `memory_recalls` holds, by memory id (as the owner: the oracle)."""
    async with as_owner(api.runtime) as conn:
        found = await conn.execute(text("SELECT memory_id, recalled_on FROM memory_recalls"))
        return {str(memory_id): on for memory_id, on in found.all()}


async def test_search_and_get_recalls_are_flushed_and_read_back(api: Api) -> None:
    alice = await api.new_agent("alice")
    searched = await api.remember(alice, key="deploy.window", value="Deploys happen on Tuesdays")
    fetched = await api.remember(alice, key="oncall", value="Oncall rotates weekly")
    untouched = await api.remember(alice, key="budget", value="Budget review in March")
    found = await api.search(alice, "when do deploys happen", k=1)
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [searched["id"]]
    got = await api.http.get(f"/v1/memories/{fetched['id']}", headers=alice.headers)
    assert got.status_code == 200, got.text

    # Noted in memory only: nothing written yet.
    assert api.runtime.recalls.pending == 2
    assert await recalled(api) == {}

    assert await api.runtime.recalls.flush() == 2
    assert await recalled(api) == {searched["id"]: today(), fetched["id"]: today()}
    assert untouched["id"] not in await recalled(api)
    assert api.runtime.recalls.pending == 0


async def test_a_later_day_replaces_an_earlier_one_and_the_same_day_rewrites_nothing(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, key="deploy.window", value="Deploys happen on Tuesdays")
    tenant = uuid.UUID(api.tenant_id)
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text("INSERT INTO memory_recalls VALUES (:t, :m, :on)"),
            {"t": tenant, "m": memory["id"], "on": today() - timedelta(days=40)},
        )
        await conn.commit()
    api.runtime.recalls.note(tenant, [uuid.UUID(memory["id"])])
    await api.runtime.recalls.flush()
    assert await recalled(api) == {memory["id"]: today()}

    async with as_owner(api.runtime) as conn:
        xmin = (await conn.execute(text("SELECT xmin::text FROM memory_recalls"))).scalar()
    api.runtime.recalls.note(tenant, [uuid.UUID(memory["id"])])
    await api.runtime.recalls.flush()
    async with as_owner(api.runtime) as conn:
        again = (await conn.execute(text("SELECT xmin::text FROM memory_recalls"))).scalar()
    assert again == xmin  # the same day: the upsert left the row as it was


async def test_recalls_go_to_their_own_tenant_only(api: Api) -> None:
    """The flush names each tenant for row-level security: a recall noted for one tenant is
    written under that tenant, and one tenant's transaction cannot write another's rows."""
    other = await api.other_tenant()
    alice = await api.new_agent("alice")
    bob = await other.new_agent("bob")
    mine = await api.remember(alice, value="Deploys happen on Tuesdays")
    theirs = await other.remember(bob, value="Deploys happen on Fridays")
    api.runtime.recalls.note(uuid.UUID(api.tenant_id), [uuid.UUID(mine["id"])])
    api.runtime.recalls.note(uuid.UUID(other.tenant_id), [uuid.UUID(theirs["id"])])
    await api.runtime.recalls.flush()
    async with as_owner(api.runtime) as conn:
        found = await conn.execute(
            text("SELECT tenant_id::text, memory_id::text FROM memory_recalls")
        )
        assert sorted(found.all()) == sorted(
            [(api.tenant_id, mine["id"]), (other.tenant_id, theirs["id"])]
        )


async def test_the_buffer_is_bounded_and_a_clean_close_writes_what_waits(api: Api) -> None:
    alice = await api.new_agent("alice")
    memories = [await api.remember(alice, key=f"k{n}", value=f"fact {n}") for n in range(4)]
    log = RecallLog(api.runtime.sessionmaker, RecallSettings(flush_ids=3, max_pending=3))
    log.note(uuid.UUID(api.tenant_id), [uuid.UUID(m["id"]) for m in memories])
    assert (log.pending, log.dropped) == (3, 1)  # bounded: the fourth is dropped, counted
    await log.close()  # stops the writer and writes what waits
    assert set(await recalled(api)) == {m["id"] for m in memories[:3]}
    assert log.pending == 0


async def test_the_writer_flushes_by_itself(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, value="Deploys happen on Tuesdays")
    log = RecallLog(api.runtime.sessionmaker, RecallSettings(flush_seconds=0.05, flush_ids=10))
    try:
        log.note(uuid.UUID(api.tenant_id), [uuid.UUID(memory["id"])])
        for _ in range(100):  # at most 5 s
            if await recalled(api):
                break
            await asyncio.sleep(0.05)
        assert await recalled(api) == {memory["id"]: today()}
    finally:
        await log.close()


@asynccontextmanager
async def _counted(
    api: Api, caller: Principal, recalls: RecallLog | None
) -> AsyncIterator[tuple[MemoryService, list[str]]]:
    """A service on a named caller's session, and the statements it sends from here on (as
    tests/integration/memory/test_round_trips.py counts them)."""
    session: AsyncSession = Call(api.runtime, "memory.test", "POST", "/t", caller=caller).db
    sent: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    connection = (await session.connection()).sync_connection
    assert connection is not None
    event.listen(connection, "before_cursor_execute", count)
    try:
        limits = api.runtime.settings.memory
        yield (
            MemoryService(session, api.runtime.embedder, limits, facts=Facts(), recalls=recalls),
            sent,
        )
    finally:
        event.remove(connection, "before_cursor_execute", count)
        await session.rollback()
        await session.close()


async def test_noting_recalls_adds_no_statement_to_a_search_or_a_get(api: Api) -> None:
    """The same two statements as without tracking (test_round_trips), none on
    memory_recalls, and the ids are noted all the same."""
    alice = await api.new_agent("alice")
    written = [
        await api.remember(alice, key=f"k{n}", value=f"billing fact number {n}") for n in range(12)
    ]
    caller = agent_principal(api, alice)
    log = RecallLog(api.runtime.sessionmaker, RecallSettings())
    counts = []
    for recalls in (None, log):
        async with _counted(api, caller, recalls) as (service, sent):
            found = await service.search(caller, SearchRequest(query="billing fact", k=10))
            assert len(found.hits) == 10
            searched = len(sent)
            await service.get(caller, uuid.UUID(written[0]["id"]))
            counts.append((searched, len(sent) - searched))
            assert not any("memory_recalls" in statement for statement in sent), sent
    assert counts[0] == counts[1]
    assert counts[1][0] == 2, counts
    first = uuid.UUID(written[0]["id"])
    assert log.pending == 10 + (0 if first in {hit.memory.id for hit in found.hits} else 1)
    await log.close()


async def test_deleting_a_tenant_deletes_its_recalls(api: Api) -> None:
    """`memgate_retire_tenant` keeps the tenants row (no cascade), so it deletes them itself."""
    admin = await Api.platform(api.http, api.runtime)
    other = await api.other_tenant("to-be-retired")
    bob = await other.new_agent("bob")
    alice = await api.new_agent("alice")
    theirs = await other.remember(bob, value="Deploys happen on Fridays")
    mine = await api.remember(alice, value="Deploys happen on Tuesdays")
    api.runtime.recalls.note(uuid.UUID(other.tenant_id), [uuid.UUID(theirs["id"])])
    api.runtime.recalls.note(uuid.UUID(api.tenant_id), [uuid.UUID(mine["id"])])
    await api.runtime.recalls.flush()
    assert set(await recalled(api)) == {theirs["id"], mine["id"]}

    path = f"/v1/tenants/{other.tenant_id}"
    disabled = await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    assert disabled.status_code == 200, disabled.text
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    done = await admin.http.delete(
        path, params={"confirm": plan["confirm"]}, headers=admin.admin.headers
    )
    assert done.status_code == 200, done.text
    assert set(await recalled(api)) == {mine["id"]}


async def test_a_tenant_that_cannot_be_written_does_not_hold_up_the_others(api: Api) -> None:
    """A tenant whose row is gone fails its upsert (foreign key): its recalls are dropped, not
    retried for ever, and the other tenants' are written in the same flush."""
    alice = await api.new_agent("alice")
    mine = await api.remember(alice, value="Deploys happen on Tuesdays")
    api.runtime.recalls.note(uuid.uuid4(), [uuid.uuid4()])
    api.runtime.recalls.note(uuid.UUID(api.tenant_id), [uuid.UUID(mine["id"])])
    assert await api.runtime.recalls.flush() == 1
    assert await recalled(api) == {mine["id"]: today()}
    assert api.runtime.recalls.pending == 0
