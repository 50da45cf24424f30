"""The auditor_casbin_role migration on a database with auditors: each `role_assignments` row
becomes a `g` line to role:auditor, compiled into the role closure the guards read (with the
tenant's policy version moved on), and downgrade gives the table back with the same holders."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
import pytest

from service.db.migrate import downgrade, upgrade
from tests.fixtures.postgres import with_database

BEFORE = "20261201_audit_keys_owner_only"
AUDITOR = "role:auditor"


def _database_before(pg_server: str, name: str) -> str:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(pg_server, name)
    upgrade(url, BEFORE)
    return url


def _world(url: str) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]:
    """Two users and a service of one tenant, each with its own name compiled (as the service
    creates principals); the first user and the service are auditors, the second is not."""
    tenant, auditor, bystander, service = (uuid.uuid4() for _ in range(4))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 'm')", (tenant,))
        for kind, principal in (("user", auditor), ("user", bystander), ("service", service)):
            conn.execute(
                "INSERT INTO principals (tenant_id, id, kind, display_name) "
                "VALUES (%s, %s, %s, 'p')",
                (tenant, principal, kind),
            )
            conn.execute(
                "INSERT INTO principal_roles (tenant_id, principal_id, role) VALUES (%s, %s, %s)",
                (tenant, principal, f"{kind}:{principal}"),
            )
        for principal in (auditor, service):
            conn.execute(
                "INSERT INTO role_assignments (tenant_id, principal_id, role) "
                "VALUES (%s, %s, 'auditor')",
                (tenant, principal),
            )
    return tenant, auditor, bystander, service


@dataclass(frozen=True)
class State:
    assigned: set[tuple[object, ...]] | None
    """`role_assignments` rows, or None when the table is gone."""
    lines: set[tuple[object, ...]]
    """`g` lines to role:auditor: (tenant, member, domain)."""
    compiled: set[tuple[object, ...]]
    """Closure rows of role:auditor: (tenant, principal)."""
    version: int
    own_names: int


def _state(url: str) -> State:
    with psycopg.connect(url) as conn:
        has_table = conn.execute("SELECT to_regclass('role_assignments')").fetchone() != (None,)
        assigned = "SELECT tenant_id, principal_id, role FROM role_assignments"
        lines = "SELECT tenant_id, v0, v2 FROM casbin_rule WHERE ptype = 'g' AND v1 = %s"
        compiled = "SELECT tenant_id, principal_id FROM principal_roles WHERE role = %s"
        version = conn.execute("SELECT policy_version FROM tenants").fetchone()
        own = conn.execute("SELECT count(*) FROM principal_roles WHERE role NOT LIKE 'role:%%'")
        return State(
            assigned=set(conn.execute(assigned)) if has_table else None,
            lines=set(conn.execute(lines, (AUDITOR,))),
            compiled=set(conn.execute(compiled, (AUDITOR,))),
            version=int(version[0]) if version else -1,
            own_names=int(own.fetchone()[0]),  # type: ignore[index]
        )


# Upgrading to head runs 20261201_tenants_lifecycle, whose deletion functions count and remove
# memory rows by design outside Visible (their bodies are read here).
@pytest.mark.bypasses_visible("migrations define the memory table and the tenant deletion")
def test_auditors_become_casbin_lines_and_downgrade_restores_the_table(pg_server: str) -> None:
    url = _database_before(pg_server, "auditor_migration")
    tenant, auditor, bystander, service = _world(url)
    before = _state(url)
    assert before.assigned == {(tenant, auditor, "auditor"), (tenant, service, "auditor")}

    upgrade(url)
    after = _state(url)
    assert after.assigned is None
    assert after.lines == {
        (tenant, f"user:{auditor}", str(tenant)),
        (tenant, f"service:{service}", str(tenant)),
    }
    assert after.compiled == {(tenant, auditor), (tenant, service)}
    assert (tenant, bystander) not in after.compiled
    assert after.version == before.version + 1
    assert after.own_names == 3  # every principal keeps its own name

    downgrade(url, BEFORE)
    down = _state(url)
    assert down.assigned == before.assigned
    assert down.lines == set()
    assert down.compiled == set()
    assert down.own_names == 3

    upgrade(url)
    assert _state(url).compiled == {(tenant, auditor), (tenant, service)}
