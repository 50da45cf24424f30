"""Citus-readiness of the real migrated schema (docs/scale.md): tenants can be sharded by
`tenant_id` without a schema change only if

- every primary key and unique constraint (and unique index) of a tenant table, a table with a
  `tenant_id` column, leads with `tenant_id`: a distributed table's unique constraints must
  contain its distribution column, and leading with it keeps each tenant's rows together in the
  index as well;
- no foreign key crosses tenants: one between two tenant tables pairs `tenant_id` with
  `tenant_id`, so both rows live on one shard; and no table without `tenant_id` (a future
  reference table) points at a tenant table, which Citus refuses.

Known exceptions are listed below, each with why; the test fails on any other, and on an
exception that no longer exists (so the list shrinks as the schema is fixed).
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg
import pytest

# Unique constraints and indexes of tenant tables that do not lead with tenant_id, as
# (table, constraint or index name). Decided by the lead (docs/scale.md, "What changes").
UNIQUE_EXCEPTIONS: dict[tuple[str, str], str] = {
    # At most one platform tenant on the whole platform: a partial unique index on
    # is_platform, global by nature. `tenants` is a reference table under Citus (replicated to
    # every node, where any unique constraint holds), so this stays as it is.
    ("tenants", "uq_tenants_platform"): "one platform tenant; tenants is a reference table",
    # The token endpoint finds a client by client_id before it knows the tenant
    # (memgate_token_client), so client ids are unique platform-wide. Distributed by
    # tenant_id, Citus cannot enforce it: a reference table mapping client_id -> tenant_id (or
    # a client id that embeds its tenant) is needed before clients can be distributed.
    ("clients", "uq_clients_client_id"): "client_id looked up before the tenant is known",
    # A token's (iss, aud) selects one registration and so one tenant before the tenant is
    # known (docs/tenants.md): unique platform-wide. tenant_issuers is small (at most 10 per
    # tenant) and read before any tenant is named: a reference table under Citus.
    ("tenant_issuers", "uq_tenant_issuers_issuer_audience"): "(iss, aud) picks the tenant",
}

# Foreign keys that cross tenants or point from a table without tenant_id at a tenant table,
# as (table, constraint name).
FOREIGN_KEY_EXCEPTIONS: dict[tuple[str, str], str] = {}

_UNIQUE = """
SELECT t.relname, i.relname,
       ARRAY(SELECT a.attname::text
               FROM unnest(ix.indkey) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
              ORDER BY k.ord)
  FROM pg_index ix
  JOIN pg_class t ON t.oid = ix.indrelid
  JOIN pg_class i ON i.oid = ix.indexrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname = 'public' AND ix.indisunique AND NOT t.relispartition
   AND EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = t.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
 ORDER BY 1, 2
"""

_FOREIGN_KEYS = """
SELECT src.relname, con.conname, dst.relname,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
              ORDER BY k.ord),
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum
              ORDER BY k.ord),
       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = src.oid
                  AND a.attname = 'tenant_id' AND NOT a.attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = dst.oid
                  AND a.attname = 'tenant_id' AND NOT a.attisdropped)
  FROM pg_constraint con
  JOIN pg_class src ON src.oid = con.conrelid
  JOIN pg_class dst ON dst.oid = con.confrelid
  JOIN pg_namespace n ON n.oid = src.relnamespace
 WHERE con.contype = 'f' AND n.nspname = 'public' AND NOT src.relispartition
   AND con.conparentid = 0
 ORDER BY 1, 2
"""


class UniqueKey(NamedTuple):
    table: str
    name: str
    columns: list[str]


class ForeignKey(NamedTuple):
    table: str
    name: str
    referenced_table: str
    columns: list[str]
    referenced: list[str]
    table_has_tenant: bool
    referenced_has_tenant: bool


Catalog = tuple[list[UniqueKey], list[ForeignKey]]


@pytest.fixture(scope="module")
def catalog(template_db: str) -> Catalog:
    with psycopg.connect(template_db) as conn:
        unique = [
            UniqueKey(str(table), str(name), [str(c) for c in columns])
            for table, name, columns in conn.execute(_UNIQUE).fetchall()
        ]
        foreign = [
            ForeignKey(
                str(row[0]),
                str(row[1]),
                str(row[2]),
                [str(c) for c in row[3]],
                [str(c) for c in row[4]],
                bool(row[5]),
                bool(row[6]),
            )
            for row in conn.execute(_FOREIGN_KEYS).fetchall()
        ]
    return unique, foreign


def test_the_schema_has_tenant_tables(catalog: Catalog) -> None:
    unique, foreign = catalog
    tables = {key.table for key in unique}
    assert {"memories", "spaces", "principals", "audit_events"} <= tables
    paired = [fk for fk in foreign if fk.table_has_tenant and fk.referenced_has_tenant]
    assert len(paired) >= 5  # the check below is not vacuous: tenant tables reference each other


def test_every_unique_key_of_a_tenant_table_leads_with_tenant_id(catalog: Catalog) -> None:
    unique, _ = catalog
    violations = {
        (key.table, key.name): key.columns
        for key in unique
        if not key.columns or key.columns[0] != "tenant_id"
    }
    unexplained = {key: cols for key, cols in violations.items() if key not in UNIQUE_EXCEPTIONS}
    assert unexplained == {}
    stale = set(UNIQUE_EXCEPTIONS) - set(violations)
    assert stale == set(), "fixed: remove them from UNIQUE_EXCEPTIONS"


def test_no_foreign_key_crosses_tenants(catalog: Catalog) -> None:
    _, foreign = catalog
    violations: dict[tuple[str, str], str] = {}
    for fk in foreign:
        pairs = dict(zip(fk.columns, fk.referenced, strict=True))
        if (
            fk.table_has_tenant
            and fk.referenced_has_tenant
            and pairs.get("tenant_id") != "tenant_id"
        ):
            violations[fk.table, fk.name] = (
                f"{fk.table}{fk.columns} -> {fk.referenced_table}{fk.referenced}: "
                "tenant_id not paired with tenant_id"
            )
        elif fk.referenced_has_tenant and not fk.table_has_tenant:
            violations[fk.table, fk.name] = f"{fk.table} (no tenant_id) -> {fk.referenced_table}"
    unexplained = {key: why for key, why in violations.items() if key not in FOREIGN_KEY_EXCEPTIONS}
    assert unexplained == {}
    stale = set(FOREIGN_KEY_EXCEPTIONS) - set(violations)
    assert stale == set(), "fixed: remove them from FOREIGN_KEY_EXCEPTIONS"
