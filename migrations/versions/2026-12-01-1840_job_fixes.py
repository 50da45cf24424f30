"""Job runs fair across tenants (issue 13, red-team fixes): `memgate_job_runs_due` puts each
tenant's oldest due run first.

It answered the 100 oldest due runs of all tenants: one tenant that queued 100 runs filled the
list, and every other tenant's runs waited behind them. Now the runs are ranked within their
tenant by age and the list is ordered by that rank, then by age: the first of every tenant
before the second of any (round robin). The runner then takes one batch of each in turn.
Ids only, as before.

Revision ID: 20261201_job_fixes
Revises: 20261201_memory_aging
Create Date: 2026-12-01 18:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_job_fixes"
down_revision: str | Sequence[str] | None = "20261201_memory_aging"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DUE_FAIR = """
CREATE OR REPLACE FUNCTION memgate_job_runs_due(lease_seconds double precision)
RETURNS TABLE (tenant_id uuid, id uuid)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT d.tenant_id, d.id FROM (
        SELECT r.tenant_id, r.id, r.enqueued_at,
               row_number() OVER (PARTITION BY r.tenant_id ORDER BY r.enqueued_at, r.id) AS turn
          FROM job_runs r
          JOIN tenants t ON t.tenant_id = r.tenant_id
                        AND t.disabled_at IS NULL AND t.retired_at IS NULL
         WHERE r.status = 'queued'
            OR (r.status = 'running'
                AND r.heartbeat_at < now() - make_interval(secs => lease_seconds))
    ) d
     ORDER BY d.turn, d.enqueued_at, d.id
     LIMIT 100
$$;
"""

DUE_FIFO = """
CREATE OR REPLACE FUNCTION memgate_job_runs_due(lease_seconds double precision)
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


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # CREATE OR REPLACE keeps the function's owner and grants (EXECUTE to the app role only).
    op.execute(DUE_FAIR)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(DUE_FIFO)
