"""Delete never lends write: without write, an update of a memory can only retract it (rt12).

Migration `stable_versions` let a principal holding delete but not write on a space update a
row through the `memories_retract` policy, whose check looked at the content columns only
(red-team findings):

- every other column (key, subject, space, links, version, writer, owner, times, sources)
  could be changed while stubbing;
- a stub left open (`superseded_at` NULL) stayed in `uq_memories_live_key`, and the writers'
  next version of the key failed with a unique violation (a 500);
- permissive policies are OR-ed, USING and WITH CHECK separately: the retract policy's USING
  (delete on space B) and the write policy's WITH CHECK (write on space A) let a caller
  rewrite another principal's row of B with a value of its own and move it into A.

No policy can compare a row with what it becomes (USING sees the old row, WITH CHECK the new
one, and a RESTRICTIVE policy is no different), so a BEFORE UPDATE trigger does: unless the
caller may write both the old row and the new one, under the grants the write policy reads
(write and read on the space, the audience readable), the update must be the exact
retraction of the old row, `memgate_is_retraction`:

- the old row is not retracted yet; the new one is a content-free stub (value, vector,
  content hash, metadata and source cleared);
- `retracted_at` is a time of this transaction (from its start to now: the API stamps the
  clock it read after the key lock), and `superseded_at` keeps its value, or is the
  retraction time when it was NULL (a stub is closed, out of every live index);
- every other column equals the old row's, compared as JSON so that a column added later is
  covered without touching this function (`lexical` is generated from `value`).

The trigger applies where row-level security does (`row_security_active`): the app role;
the owner in a migration (which lifts FORCE) is not restricted, as the policies do not
restrict it. The retract policy's own check now also wants the stub closed. Stubs already
left open are closed here.

Also (rt12): the service no longer lists a memory's own space in its `read_requires` (it
narrows nothing, and listing it put the memory in another chain than its key's). Rows that
list it are normalized here, so old and new versions of a key are one chain again; a live row
whose normalized audience already has a live version of its key (a chain the old rule had
forked) keeps what it has. Visibility is the same either way, so downgrade leaves them.

Revision ID: 20261201_retract_only_stubs
Revises: 20261201_space_gates
Create Date: 2026-12-01 17:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_retract_only_stubs"
down_revision: str | Sequence[str] | None = "20261201_hybrid_recall"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"
DELETER = (
    f"{TENANT} AND space_id = ANY (CAST((SELECT memgate_granted('delete')) AS uuid[])) "
    "AND space_id = ANY (CAST((SELECT memgate_granted('read')) AS uuid[])) "
    "AND read_requires <@ (SELECT memgate_granted('read'))"
)
STUB = (
    "retracted_at IS NOT NULL AND value = '' AND embedding IS NULL AND source IS NULL "
    "AND metadata = '{}'::jsonb AND octet_length(content_hash) = 0"
)
"""The retract policy's check of migration `stable_versions`."""
CLOSED_STUB = f"{STUB} AND superseded_at IS NOT NULL"

RETRACTION_COLUMNS = (
    "retracted_at",
    "superseded_at",
    "value",
    "embedding",
    "content_hash",
    "metadata",
    "source",
    "lexical",
)
"""The columns a retraction changes (`lexical` follows `value`); every other one stays."""

UPGRADE = f"""
CREATE FUNCTION memgate_is_retraction(o memories, n memories) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = public, pg_temp
RETURN o.retracted_at IS NULL
   AND n.retracted_at BETWEEN now() AND clock_timestamp()
   AND n.superseded_at IS NOT DISTINCT FROM coalesce(o.superseded_at, n.retracted_at)
   AND n.value = '' AND n.embedding IS NULL AND n.source IS NULL
   AND n.metadata = '{{}}'::jsonb AND octet_length(n.content_hash) = 0
   AND to_jsonb(n) - CAST(:columns AS text[]) = to_jsonb(o) - CAST(:columns AS text[]);

CREATE FUNCTION memgate_retract_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    writable uuid[];
    readable uuid[];
BEGIN
    IF NOT row_security_active('public.memories'::regclass) THEN
        RETURN NEW;
    END IF;
    SELECT memgate_granted('write'), memgate_granted('read') INTO writable, readable;
    IF (OLD.tenant_id = memgate_tenant() AND NEW.tenant_id = OLD.tenant_id
        AND OLD.space_id = ANY (writable) AND OLD.space_id = ANY (readable)
        AND OLD.read_requires <@ readable
        AND NEW.space_id = ANY (writable) AND NEW.space_id = ANY (readable)
        AND NEW.read_requires <@ readable) IS TRUE
       OR memgate_is_retraction(OLD, NEW) IS TRUE THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'without write on memory %, an update may only retract it', OLD.id
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'delete retracts a version into a closed, content-free stub; '
                     'nothing else changes';
END
$$;
REVOKE ALL ON FUNCTION memgate_is_retraction(memories, memories), memgate_retract_only()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_is_retraction(memories, memories) TO {APP_ROLE};

CREATE TRIGGER memories_retract_only BEFORE UPDATE ON memories
    FOR EACH ROW EXECUTE FUNCTION memgate_retract_only();
ALTER TABLE memories ENABLE ALWAYS TRIGGER memories_retract_only;
"""


NORMALIZE_AUDIENCE = """
UPDATE memories m SET read_requires = array_remove(m.read_requires, m.space_id)
 WHERE m.space_id = ANY (m.read_requires)
   AND NOT (m.superseded_at IS NULL AND m.revoked_at IS NULL AND EXISTS (
       SELECT 1 FROM memories o
        WHERE o.tenant_id = m.tenant_id AND o.space_id = m.space_id
          AND o.subject = m.subject AND o.kind = m.kind AND o.key = m.key
          AND o.superseded_at IS NULL AND o.revoked_at IS NULL
          AND o.read_requires = array_remove(m.read_requires, m.space_id)))
"""
"""A memory's own space out of its `read_requires`, unless that would put two live versions
in one key's live slot (`uq_memories_live_key`)."""


def _columns() -> str:
    return "'{" + ",".join(RETRACTION_COLUMNS) + "}'"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Close the stubs a deleter may have left open (they hold their key's live slot). As the
    # owner, bound by FORCE ROW LEVEL SECURITY: lifted for this transaction only.
    op.execute("ALTER TABLE memories NO FORCE ROW LEVEL SECURITY")
    op.execute(
        "UPDATE memories SET superseded_at = retracted_at "
        "WHERE retracted_at IS NOT NULL AND superseded_at IS NULL"
    )
    op.execute(NORMALIZE_AUDIENCE)
    op.execute("ALTER TABLE memories FORCE ROW LEVEL SECURITY")
    op.execute(UPGRADE.replace(":columns", _columns()))
    op.execute(
        f"ALTER POLICY memories_retract ON memories USING ({DELETER}) "
        f"WITH CHECK ({DELETER} AND {CLOSED_STUB})"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"ALTER POLICY memories_retract ON memories USING ({DELETER}) "
        f"WITH CHECK ({DELETER} AND {STUB})"
    )
    op.execute("DROP TRIGGER memories_retract_only ON memories")
    op.execute("DROP FUNCTION memgate_retract_only()")
    op.execute("DROP FUNCTION memgate_is_retraction(memories, memories)")
