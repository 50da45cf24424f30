"""What the policy-admin and auditor guards cost an admin call, now and before.

    .venv/bin/python -m bench.role_guard [--members 2000] [--depth 7] [--repeat 300]

One tenant: `--members` users in the innermost of `--depth` nested teams, the outermost of
which is in role:policy_admin and role:auditor (a member reaches both through `--depth` + 1
links), each user with its three personal-space grants (so `casbin_rule` holds what a tenant
that size holds); and the bootstrap-style admin holding both roles directly. Timed per guard
call, `--repeat` times, inside one open transaction with the tenant named (the guard runs in
the request's transaction), medians and p95 in microseconds:

- now: one primary-key lookup in the compiled closure (`holds_role`, what both guards run);
- before, policy admin: the caller's principal row, then a recursive walk of `casbin_rule`
  from its name (the statement the guard ran until this change, copied here verbatim);
- before, auditor: a lookup in the `role_assignments` table, which no longer exists (a direct
  assignment only; the same cost class as the lookup now), so it is not re-run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import psycopg
from sqlalchemy import text

from bench.database import bench_database
from service.db.models import Principal
from service.db.session import create_engine, create_sessionmaker
from service.db.tenancy import name_tenant
from service.policy.compile import lock_policy, recompile
from service.policy.powers import holds_role
from service.policy.rules import AUDITOR, POLICY_ADMIN, principal_name, space_name

# The previous guard's statement (service/policy/service.py before this change).
PREVIOUS_REACHES = text(
    """
    WITH RECURSIVE r(role, depth) AS (
        SELECT CAST(:name AS text), 0
      UNION
        SELECT g.v1, r.depth + 1 FROM r
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v0 = r.role
         WHERE r.depth < :max_depth
    )
    SELECT EXISTS (SELECT 1 FROM r WHERE role = :target)
    """
)


def load(url: str, members: int, depth: int) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """The tenant; answers (tenant, the direct admin, one member reaching the roles deepest)."""
    tenant, admin = uuid.uuid4(), uuid.uuid4()
    users = [uuid.uuid4() for _ in range(members)]
    teams = [f"team:{uuid.uuid4()}" for _ in range(depth)]
    domain = str(tenant)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 'bench')", (tenant,))
        with conn.cursor().copy(
            "COPY principals (tenant_id, id, kind, display_name) FROM STDIN"
        ) as copy:
            for user in (admin, *users):
                copy.write_row((tenant, user, "user", "u"))
        with conn.cursor().copy(
            "COPY casbin_rule (tenant_id, ptype, v0, v1, v2, v3) FROM STDIN"
        ) as copy:
            for role in (POLICY_ADMIN, AUDITOR):
                copy.write_row((tenant, "g", f"user:{admin}", role, domain, None))
                copy.write_row((tenant, "g", teams[-1], role, domain, None))
            for inner, outer in itertools.pairwise(teams):
                copy.write_row((tenant, "g", inner, outer, domain, None))
            for user in users:
                copy.write_row((tenant, "g", f"user:{user}", teams[0], domain, None))
                for action in ("read", "write", "delete"):
                    row = (f"user:{user}", domain, space_name(uuid.uuid4()), action)
                    copy.write_row((tenant, "p", *row))
        conn.execute("ANALYZE casbin_rule")
    return tenant, admin, users[0]


async def _timed(
    repeat: int, calls: dict[str, Callable[[], Awaitable[bool]]]
) -> dict[str, tuple[float, float]]:
    """Median and p95 of each call, in microseconds, the calls interleaved round by round (so
    a neighbour's load on the shared machine falls on all of them alike) after one warm-up
    round; every call must find the role."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(repeat + 1):
        for name, call in calls.items():
            started = time.perf_counter()
            assert await call(), "the caller should hold the role"
            if round_:
                times[name].append((time.perf_counter() - started) * 1e6)
    return {
        name: (statistics.median(spent), statistics.quantiles(spent, n=20)[-1])
        for name, spent in times.items()
    }


async def run(url: str, members: int, depth: int, repeat: int) -> None:
    tenant, admin, member = load(url, members, depth)
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)
    async with sessionmaker() as session, session.begin():
        await lock_policy(session, tenant)
        await recompile(session, tenant)
    print(
        f"tenant: {members} members in the innermost of {depth} nested teams (roles reached "
        f"through {depth + 1} links), {3 * members + members + depth + 3} casbin rules"
    )
    print(f"  {'caller / guard':<44}{'p50 µs':>9}{'p95 µs':>9}")
    async with sessionmaker() as session, session.begin():
        await name_tenant(session, tenant)
        for label, who in (("direct admin", admin), (f"member, {depth + 1} links", member)):

            async def previous(who: uuid.UUID = who) -> bool:
                # The previous guard: the caller's row (expunged, so it is read again each call
                # as in a fresh request), then the walk.
                row = await session.get(Principal, (tenant, who))
                assert row is not None
                session.expunge(row)
                params = {
                    "tenant": tenant,
                    "name": principal_name(row.kind, row.id),
                    "target": POLICY_ADMIN,
                    "max_depth": 10,
                }
                return bool((await session.execute(PREVIOUS_REACHES, params)).scalar_one())

            async def now(who: uuid.UUID = who, role: str = POLICY_ADMIN) -> bool:
                return await holds_role(session, tenant, who, role)

            async def now_auditor(who: uuid.UUID = who) -> bool:
                return await holds_role(session, tenant, who, AUDITOR)

            found = await _timed(
                repeat,
                {
                    "policy admin, before (row + recursive walk)": previous,
                    "policy admin, now (closure lookup)": now,
                    "auditor, now (closure lookup)": now_auditor,
                },
            )
            print(f"  {label}")
            for name, (p50, p95) in found.items():
                print(f"    {name:<42}{p50:9.0f}{p95:9.0f}")
            before, after = (found[name][0] for name in list(found)[:2])
            print(f"    {'ratio before/now (p50)':<42}{before / after:9.1f}x")
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    if not 1 <= args.depth <= 7:
        parser.error("--depth: 1..7 (the API accepts chains of at most 8 links)")
    with bench_database() as url:
        asyncio.run(run(url, args.members, args.depth, args.repeat))


if __name__ == "__main__":
    main()
