"""Crypto-shredding (issue 16): a memory's text sealed under its owner's data key.

- `memories.value_sealed` (nonce + AES-256-GCM ciphertext) and `memories.value_key` (the data
  key's id): set on the rows of a tenant with `crypto_shredding` on, whose `value` is then "".
  The data keys live outside PostgreSQL (service/shredding): no copy of this database holds
  them, so destroying one makes the sealed text in every copy (WAL, replicas, backups)
  unreadable.
- `memories.lexical` stops being generated from `value` (a sealed row has no text there): it
  becomes a plain column, set by the trigger `memories_lexical` from `value` for every
  unsealed row exactly as before, and given by the insert, from the plaintext, for a sealed
  one. `DROP EXPRESSION` keeps the stored lexemes and the GIN index; nothing is rewritten.
- `memgate_is_retraction`: a stub also clears `value_sealed` and `value_key`.
- `memgate_stored_bytes`: a sealed row counts its ciphertext (the text + 28 bytes).
- `memgate_erasure_sealed(plan)`: the sealed values an erasure reaches (their owners and key
  ids), for the proof's needles, SECURITY DEFINER like `memgate_erasure_values`;
  `memgate_erasure_sealed_mentions(plan)`: the live sealed rows it does not erase, which the
  service opens for the mention scan (`strpos` over `value` cannot see their text).

Revision ID: 20261204_crypto_shredding
Revises: 20261203_erasure
Create Date: 2026-12-04 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261204_crypto_shredding"
down_revision: str | Sequence[str] | None = "20261203_erasure"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"

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
"""Migration `retract_only_stubs`'s list; this one adds the sealed columns to it."""

IS_RETRACTION = """
CREATE OR REPLACE FUNCTION memgate_is_retraction(o memories, n memories) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = public, pg_temp
RETURN o.retracted_at IS NULL
   AND n.retracted_at BETWEEN now() AND clock_timestamp()
   AND n.superseded_at IS NOT DISTINCT FROM coalesce(o.superseded_at, n.retracted_at)
   AND n.value = '' AND n.embedding IS NULL AND n.source IS NULL :sealed
   AND n.metadata = '{}'::jsonb AND octet_length(n.content_hash) = 0
   AND to_jsonb(n) - CAST(:columns AS text[]) = to_jsonb(o) - CAST(:columns AS text[]);
"""

STORED_BYTES = """
CREATE OR REPLACE FUNCTION memgate_stored_bytes(m memories) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN m.retracted_at IS NULL THEN
    octet_length(m.subject) + octet_length(m.key) + octet_length(m.value) :sealed
    + coalesce(octet_length(m.source), 0) + octet_length(m.metadata::text) ELSE 0 END $$;
"""

UPGRADE = f"""
ALTER TABLE memories ADD COLUMN value_sealed bytea, ADD COLUMN value_key uuid;
ALTER TABLE memories ADD CONSTRAINT ck_memories_sealed CHECK (
    (value_sealed IS NULL) = (value_key IS NULL) AND (value_sealed IS NULL OR value = ''));
ALTER TABLE memories ALTER COLUMN value_sealed SET STATISTICS 0;
ALTER TABLE memories ALTER COLUMN lexical DROP EXPRESSION;

CREATE FUNCTION memgate_lexical() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    -- An unsealed row's lexemes are its text's, as when the column was generated; a sealed
    -- row's were made by its insert, from the plaintext sent as that statement's parameter
    -- (stored in no column: docs/erasure.md says where a server could still log it).
    IF NEW.value_sealed IS NULL THEN
        NEW.lexical := to_tsvector(NEW.lexical_config, NEW.value);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER memories_lexical BEFORE INSERT OR UPDATE OF value, value_sealed, lexical_config
    ON memories FOR EACH ROW EXECUTE FUNCTION memgate_lexical();

CREATE FUNCTION memgate_erasure_sealed(p_plan uuid)
RETURNS TABLE (memory_id uuid, owner_id uuid, value_key uuid, value_sealed bytea)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT m.id, m.owner_id, m.value_key, m.value_sealed
      FROM memories m
     WHERE m.tenant_id = memgate_tenant() AND m.value_sealed IS NOT NULL
       AND m.id IN (SELECT r.memory_id FROM memgate_erasure_reach(p_plan) r
                     WHERE r.why <> 'mention')
$$;
-- The live sealed rows a plan with names does not erase: the mention scan opens them in the
-- service (the database cannot read their text) and lists those naming one of the names.
CREATE FUNCTION memgate_erasure_sealed_mentions(p_plan uuid)
RETURNS TABLE (tenant_id uuid, memory_id uuid, space_id uuid, version integer, owner_id uuid,
               value_key uuid, value_sealed bytea)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT m.tenant_id, m.id, m.space_id, m.version, m.owner_id, m.value_key, m.value_sealed
      FROM memories m JOIN erasure_plans p
        ON p.tenant_id = memgate_tenant() AND p.id = p_plan AND cardinality(p.names) > 0
     WHERE m.tenant_id = memgate_tenant() AND m.value_sealed IS NOT NULL
       AND m.retracted_at IS NULL
       AND m.id NOT IN (SELECT r.memory_id FROM memgate_erasure_reach(p_plan) r
                         WHERE r.why <> 'mention')
$$;
REVOKE ALL ON FUNCTION memgate_erasure_sealed(uuid), memgate_erasure_sealed_mentions(uuid)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_erasure_sealed(uuid), memgate_erasure_sealed_mentions(uuid)
    TO {APP_ROLE};
"""

DOWNGRADE = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM memories WHERE value_sealed IS NOT NULL) THEN
        RAISE EXCEPTION 'sealed memories exist: a downgrade would lose their text'
            USING HINT = 'turn crypto_shredding off and rewrite or erase the sealed rows first';
    END IF;
END $$;
DROP FUNCTION memgate_erasure_sealed_mentions(uuid), memgate_erasure_sealed(uuid);
DROP TRIGGER memories_lexical ON memories;
DROP FUNCTION memgate_lexical();
DROP INDEX ix_memories_lexical;
ALTER TABLE memories DROP COLUMN lexical;
ALTER TABLE memories ADD COLUMN lexical tsvector
    GENERATED ALWAYS AS (to_tsvector(lexical_config, value)) STORED;
ALTER TABLE memories ALTER COLUMN lexical SET STATISTICS 0;
CREATE INDEX ix_memories_lexical ON memories USING gin (tenant_id, lexical)
    WHERE superseded_at IS NULL AND revoked_at IS NULL;
ALTER TABLE memories DROP CONSTRAINT ck_memories_sealed;
ALTER TABLE memories DROP COLUMN value_key, DROP COLUMN value_sealed;
"""


def _columns(*extra: str) -> str:
    return "'{" + ",".join((*RETRACTION_COLUMNS, *extra)) + "}'"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(UPGRADE)
    op.execute(
        IS_RETRACTION.replace(":columns", _columns("value_sealed", "value_key")).replace(
            ":sealed", "AND n.value_sealed IS NULL AND n.value_key IS NULL"
        )
    )
    op.execute(STORED_BYTES.replace(":sealed", "+ coalesce(octet_length(m.value_sealed), 0)"))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(STORED_BYTES.replace(":sealed", ""))
    op.execute(IS_RETRACTION.replace(":columns", _columns()).replace(":sealed", ""))
    op.execute(DOWNGRADE)
