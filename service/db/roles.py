"""Who the app is in the database.

The migrations run as the owner. The app logs in as a role that is only a *member* of the
non-owner role `memgate_app` (INHERIT): it has that role's privileges and nothing to return to,
so `RESET ROLE` gains nothing. The embedded cluster and the test cluster trust local
connections, so the service makes that login itself (`provision_app_login`); in production the
operator creates it and gives it to the app as `DATABASE_URL`, with the owner's URL in
`MEMGATE_MIGRATION_DATABASE_URL`. `/readyz` fails while any of `login_problems` holds: a
login or role that could bypass row-level security voids it.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

APP_LOGIN = "memgate_api"

_LOGIN_PROBLEMS = text(
    """
    SELECT r.rolsuper, r.rolbypassrls, r.rolcreaterole,
           pg_has_role(session_user, c.relowner, 'USAGE') AS can_become_owner,
           (SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = current_user)
               AS app_role_bypasses,
           (SELECT relforcerowsecurity FROM pg_class WHERE oid = to_regclass(:guarded))
               AS rls_forced,
           has_table_privilege('signing_keys', 'INSERT')
               OR has_table_privilege('signing_keys', 'UPDATE')
               OR has_table_privilege('signing_keys', 'DELETE') AS writes_keys,
           has_table_privilege('audit_signing_keys', 'INSERT')
               OR has_table_privilege('audit_signing_keys', 'UPDATE')
               OR has_table_privilege('audit_signing_keys', 'DELETE') AS writes_audit_keys,
           (SELECT relrowsecurity FROM pg_class WHERE oid = 'audit_checkpoints'::regclass)
               AS checkpoints_guarded,
           has_table_privilege('audit_checkpoints', 'INSERT') AS writes_checkpoints
      FROM pg_roles r, pg_class c
     WHERE r.rolname = session_user AND c.oid = 'audit_events'::regclass
    """
)


def provision_app_login(owner_url: str, app_role: str, login: str = APP_LOGIN) -> str:
    """As the owner: make `login` (LOGIN, member of `app_role`, nothing else) if it is missing,
    and return the owner's URL with that user and no password."""
    # visible: ok cluster admin: creates the app login, reads pg_roles only
    with psycopg.connect(owner_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
            conn.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS "
                    "INHERIT IN ROLE {}"
                ).format(sql.Identifier(login), sql.Identifier(app_role))
            )
    return app_login_url(owner_url, login)


def app_login_url(owner_url: str, login: str = APP_LOGIN) -> str:
    """The owner's URL with the app's login as user and no password (the embedded cluster and
    the test cluster trust local connections)."""
    url = make_url(owner_url).set(username=login, password=None)
    return url.render_as_string(hide_password=False)


async def login_problems(engine: AsyncEngine) -> list[str]:
    """Why the app's login could leave the app role (empty when it cannot)."""
    async with engine.connect() as conn:
        # A catalog lookup of the table's RLS flag (no memory row is read).
        row = (await conn.execute(_LOGIN_PROBLEMS, {"guarded": "public.memories"})).one()
    found = []
    if row.rolsuper:
        found.append("the database login is a superuser")
    if row.rolbypassrls:
        found.append("the database login bypasses row-level security")
    if row.rolcreaterole:
        found.append("the database login may create roles")
    if row.can_become_owner:
        found.append("the database login can act as the owner of the tables")
    if row.app_role_bypasses:
        found.append("the app role bypasses row-level security")
    if not row.rls_forced:
        found.append("row-level security is not forced on memories")
    if row.writes_keys:
        # It could publish a token key of its own (review item 5).
        found.append("the app role may write token signing keys")
    if row.writes_audit_keys:
        # A key it planted was trusted: calls stopped, forged checkpoints verified.
        found.append("the app role may write audit signing keys")
    if not row.checkpoints_guarded:
        found.append("row-level security is off on audit_checkpoints")
    if row.writes_checkpoints:
        # Junk it inserted directly hid every real checkpoint and took the signers' seqs; it
        # writes them only through audit_checkpoint_insert() (red-team round 2, F1).
        found.append("the app role may insert checkpoints directly")
    return found
