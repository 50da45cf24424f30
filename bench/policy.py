"""What a policy change costs in a large tenant, and what reading the grants costs a request.

    .venv/bin/python -m bench.policy [--members 2000] [--spaces 300] [--repeat 5]

One tenant: a team of `--members` principals, each with its personal space (three `p` rules
each, as the service seeds them), and a tree of `--spaces` team spaces (a root, then children
in levels of at most 8). Timed, each `--repeat` times (median), each in its own
transaction the way the policy API runs it (lock, rule, scoped rebuild, version bump, commit):

- granting the team read on the root (one `p` rule that reaches every space);
- adding one member to the team (one `g` rule);
- creating a sub-space under the root (one `g2` rule: the new leaf inherits the root's grants);
- a full compile of the tenant;
- the grants read by one request (the `allowed` array of Visible, for one member);
- and, for comparison, writing the member-by-space product the old `space_grants` table held
  (what the team grant and each sub-space used to rewrite).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.database import bench_database
from service.db.session import create_engine, create_sessionmaker
from service.policy.compile import apply_changes, lock_policy, recompile
from service.policy.rules import Rule, add_rules, space_name

LEVEL = 8


def load(url: str, members: int, spaces: int) -> tuple[uuid.UUID, str, list[uuid.UUID]]:
    tenant, team = uuid.uuid4(), f"team:{uuid.uuid4()}"
    principals = [uuid.uuid4() for _ in range(members)]
    personal = [uuid.uuid4() for _ in range(members)]
    space_ids = [uuid.uuid4() for _ in range(spaces)]
    domain = str(tenant)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 'bench')", (tenant,))
        with conn.cursor().copy(
            "COPY principals (tenant_id, id, kind, display_name) FROM STDIN"
        ) as copy:
            for principal in principals:
                copy.write_row((tenant, principal, "user", "member"))
        with conn.cursor().copy("COPY spaces (tenant_id, id, kind, name) FROM STDIN") as copy:
            for space in space_ids:
                copy.write_row((tenant, space, "team", "s"))
        with conn.cursor().copy(
            "COPY spaces (tenant_id, id, kind, name, owner_id) FROM STDIN"
        ) as copy:
            for principal, space in zip(principals, personal, strict=True):
                copy.write_row((tenant, space, "personal", "p", principal))
        with conn.cursor().copy(
            "COPY casbin_rule (tenant_id, ptype, v0, v1, v2) FROM STDIN"
        ) as copy:
            for principal in principals:
                copy.write_row((tenant, "g", f"user:{principal}", team, domain))
            # Space i's parent is space (i - 1) // LEVEL: a tree at most a few levels deep.
            for i in range(1, spaces):
                child, parent = space_name(space_ids[i]), space_name(space_ids[(i - 1) // LEVEL])
                copy.write_row((tenant, "g2", child, parent, domain))
        with conn.cursor().copy(
            "COPY casbin_rule (tenant_id, ptype, v0, v1, v2, v3) FROM STDIN"
        ) as copy:
            for principal, space in zip(principals, personal, strict=True):
                for action in ("read", "write", "delete"):
                    row = (f"user:{principal}", domain, space_name(space), action)
                    copy.write_row((tenant, "p", *row))
    return tenant, team, space_ids


async def _timed(
    sessionmaker: async_sessionmaker[AsyncSession],
    repeat: int,
    step: Callable[[AsyncSession, int], Awaitable[object]],
) -> float:
    times = []
    for n in range(repeat):
        started = time.perf_counter()
        async with sessionmaker() as session, session.begin():
            await step(session, n)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def run(url: str, members: int, spaces: int, repeat: int) -> None:
    tenant, team, space_ids = load(url, members, spaces)
    root = space_name(space_ids[0])
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)

    async def full(session: AsyncSession, _: int) -> None:
        await lock_policy(session, tenant)
        await recompile(session, tenant)

    async def change(session: AsyncSession, rules: list[Rule]) -> None:
        await lock_policy(session, tenant)
        await add_rules(session, tenant, rules)
        await apply_changes(session, tenant, rules)

    async def grant(session: AsyncSession, n: int) -> None:
        await change(session, [Rule("p", team, root, ("read", "write", "delete")[n % 3])])

    async def join(session: AsyncSession, n: int) -> None:
        member = uuid.uuid4()
        await session.execute(
            text(
                "INSERT INTO principals (tenant_id, id, kind, display_name) "
                "VALUES (:t, :id, 'user', 'late')"
            ),
            {"t": tenant, "id": member},
        )
        await change(session, [Rule("g", f"user:{member}", team)])

    async def subspace(session: AsyncSession, n: int) -> None:
        space = uuid.uuid4()
        await session.execute(
            text("INSERT INTO spaces (tenant_id, id, kind, name) VALUES (:t, :id, 'team', 's')"),
            {"t": tenant, "id": space},
        )
        await change(session, [Rule("g2", space_name(space), root)])

    async with sessionmaker() as session, session.begin():
        member = await session.scalar(
            text("SELECT id FROM principals WHERE tenant_id = :t LIMIT 1"), {"t": tenant}
        )

    async def read(session: AsyncSession, _: int) -> None:
        await session.execute(
            text(
                "SELECT set_config('memgate.tenant_id', :t, true), "
                "set_config('memgate.principal_id', :p, true)"
            ),
            {"t": str(tenant), "p": str(member)},
        )
        allowed = await session.scalar(text("SELECT cardinality(memgate_granted('read'))"))
        assert allowed is not None
        assert allowed >= spaces, "the member should read every space of the tree"

    async def product(session: AsyncSession, _: int) -> None:
        await session.execute(
            text(
                "CREATE TEMP TABLE old_space_grants ON COMMIT DROP AS "
                "SELECT * FROM space_grants WHERE tenant_id = :t"
            ),
            {"t": tenant},
        )

    print(f"tenant: {members} members in one team, {spaces} spaces in a tree")
    steps = {
        "full compile": full,
        "grant the team an action on the root": grant,
        "add one member to the team": join,
        "create a sub-space under the root": subspace,
        "read one member's grants (RLS function)": read,
    }
    for label, step in steps.items():
        print(f"  {label:<42} p50 {await _timed(sessionmaker, repeat, step):9.1f} ms")
    async with sessionmaker() as session, session.begin():
        counts = {
            table: await session.scalar(
                text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"), {"t": tenant}
            )
            for table in ("principal_roles", "role_grants", "space_grants")
        }
    old = await _timed(sessionmaker, repeat, product)
    print(
        f"  compiled rows now: principal_roles {counts['principal_roles']}, role_grants "
        f"{counts['role_grants']}; the old table held {counts['space_grants']} "
        f"(writing them: {old:.1f} ms; the old compiler rewrote them all for the team grant "
        "and for every sub-space)"
    )
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--spaces", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.members, args.spaces, args.repeat))


if __name__ == "__main__":
    main()
