"""Job runs (issue 13): the runner's table, its two platform entrances, and the expiry index.

- `job_runs`: one row per run of a job in a tenant: what it covers (space, dry run, options),
  where it is (status, cursor, summed counts, batches, failed attempts, heartbeat), why it stopped (a problem
  slug and a detail that holds no memory content), who asked (`enqueued_by`), who it runs as
  (`principal_id`, the tenant's job principal) and the grants that principal held when it was
  enqueued (`granted`: `{"read": [...], "write": [...], "delete": [...]}`), which the runner
  intersects with the grants it holds at each batch. Row-level security by tenant, as every
  tenant table; the app role may read, insert and update runs, never delete them (a run is
  part of the record of what was done).
- `memgate_job_runs_due(lease)`: the one read across tenants the runner makes: the ids of runs
  queued, or running without a heartbeat for `lease` seconds (their process died). Ids only.
- `memgate_job_tenants()`: the enabled tenants, ids only, for the scheduler to enqueue runs in.
- a trigger on `tenants`: when a tenant is deleted (retired), its runs go with its data.
- `ix_memories_expiry`: `(tenant_id, expires_at)` over rows that have an expiry, so the sweep
  reads the rows past their time directly and never lists a tenant's memories.

Revision ID: 20261201_job_runs
Revises: 20261201_retract_only_stubs
Create Date: 2026-12-01 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_job_runs"
down_revision: str | Sequence[str] | None = "20261201_retract_only_stubs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"

SCHEMA = f"""
CREATE TABLE job_runs (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    job text NOT NULL,
    space_id uuid,
    dry_run boolean NOT NULL DEFAULT false,
    options jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    status text NOT NULL DEFAULT 'queued',
    cursor text,
    counts jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    batches integer NOT NULL DEFAULT 0,
    failures integer NOT NULL DEFAULT 0,
    error_slug text,
    error_detail text,
    enqueued_by uuid,
    principal_id uuid NOT NULL,
    granted jsonb NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    heartbeat_at timestamptz,
    CONSTRAINT pk_job_runs PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_job_runs_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE,
    CONSTRAINT ck_job_runs_status
        CHECK (status IN ('queued', 'running', 'finished', 'failed', 'refused'))
);
CREATE INDEX ix_job_runs_pending ON job_runs (status, heartbeat_at)
    WHERE status IN ('queued', 'running');
ALTER TABLE job_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_runs_tenant ON job_runs TO {APP_ROLE} USING ({TENANT}) WITH CHECK ({TENANT});
GRANT SELECT, INSERT, UPDATE ON job_runs TO {APP_ROLE};

"""

TENANTS = """
CREATE FUNCTION memgate_job_tenants() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT t.tenant_id FROM tenants t
     WHERE t.disabled_at IS NULL AND t.retired_at IS NULL
     ORDER BY t.tenant_id
$$;
"""

GRANTS = f"""
REVOKE ALL ON FUNCTION memgate_job_runs_due(double precision), memgate_job_tenants()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_job_runs_due(double precision), memgate_job_tenants()
    TO {APP_ROLE};
"""

DUE = """
CREATE FUNCTION memgate_job_runs_due(lease_seconds double precision)
RETURNS TABLE (tenant_id uuid, id uuid)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT r.tenant_id, r.id FROM job_runs r
      JOIN tenants t ON t.tenant_id = r.tenant_id
                    AND t.disabled_at IS NULL AND t.retired_at IS NULL
     WHERE r.status = 'queued'
        OR (r.status = 'running'
            AND r.heartbeat_at < now() - make_interval(secs => lease_seconds))
     ORDER BY r.enqueued_at
     LIMIT 100
$$;
"""
"""Runs a runner should take up: queued, or running with a heartbeat older than the lease
(the process that ran them died); a live run's heartbeat is fresher, so it is not taken."""

RETIRED = """
CREATE FUNCTION memgate_retired_tenant_runs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM job_runs WHERE tenant_id = NEW.tenant_id;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION memgate_retired_tenant_runs() FROM PUBLIC;
CREATE TRIGGER tenants_retired_runs AFTER UPDATE OF retired_at ON tenants
    FOR EACH ROW WHEN (OLD.retired_at IS NULL AND NEW.retired_at IS NOT NULL)
    EXECUTE FUNCTION memgate_retired_tenant_runs();
"""
"""A deleted (retired) tenant's runs go with its data (`memgate_retire_tenant`): their options
name subjects, which must not outlive the tenant. The app role itself may not delete runs."""

EXPIRY_INDEX = """
CREATE INDEX ix_memories_expiry ON memories (tenant_id, expires_at)
    WHERE expires_at IS NOT NULL
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(SCHEMA)
    op.execute(DUE)
    op.execute(TENANTS)
    op.execute(GRANTS)
    op.execute(RETIRED)
    op.execute(EXPIRY_INDEX)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP INDEX ix_memories_expiry")
    op.execute("DROP TRIGGER tenants_retired_runs ON tenants")
    op.execute("DROP FUNCTION memgate_retired_tenant_runs()")
    op.execute("DROP FUNCTION memgate_job_tenants()")
    op.execute("DROP FUNCTION memgate_job_runs_due(double precision)")
    op.execute("DROP TABLE job_runs")
