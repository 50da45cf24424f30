"""`memgate serve` as a deployment runs it, through real processes: HTTPS with a self-signed
development certificate (with workers), the migration Job's `memgate migrate` followed by a pod's
`serve --no-migrate` as the app's login alone (with certificate files given), and the refusals:
an unmigrated database, plain HTTP on every address, a shared database without the shared
key-encryption key."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from service.db.roles import app_login_url
from service.http.tls import self_signed
from tests.fixtures.postgres import app_login, with_database
from tests.integration.cli.test_embedded_lifecycle import (
    COMMAND_TIMEOUT,
    MEMGATE,
    Server,
    _free_port,
)
from tests.integration.cli.test_serve_workers import _all_workers_up

HSTS = "max-age=31536000; includeSubDomains"


@dataclass
class TlsServer(Server):
    """A serve over HTTPS; `ca` is the certificate the client trusts (it may appear only once
    serve made it)."""

    ca: Path = Path()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def readyz(self) -> int | None:
        if not self.ca.exists():
            return None
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5, verify=_trusting(self.ca)).status_code
        except httpx.TransportError:
            return None

    def served_certificate(self) -> str:
        return ssl.get_server_certificate(("127.0.0.1", self.port))


def _trusting(ca: Path) -> ssl.SSLContext:
    """A client context that trusts `ca` alone (the system's roots are not asked)."""
    return ssl.create_default_context(cafile=str(ca))


def _sha256(pem: str) -> str:
    cert = x509.load_pem_x509_certificate(pem.encode())
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


@pytest.fixture
def root() -> Iterator[Path]:
    # Not tmp_path: pytest prunes old basetemp dirs, and parallel runs did so under a cluster.
    made = Path(tempfile.mkdtemp(prefix="memgate-serve-modes-"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _env(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "MEMGATE_DATA_DIR": str(data_dir),
        "MEMGATE_HOST": "127.0.0.1",
        "MEMGATE_PORT": str(port),
        "MEMGATE_METRICS_PORT": "0",
        "MEMGATE_AUDIT_CHECKPOINT_SECONDS": "0",
        **extra,
    }
    for name in (
        "DATABASE_URL",
        "MEMGATE_MIGRATION_DATABASE_URL",
        "MEMGATE_WORKERS",
        "MEMGATE_TLS",
        "MEMGATE_PUBLIC_URL",
        "MEMGATE_KEY_ENCRYPTION_KEY",
    ):
        if name not in extra:
            env.pop(name, None)
    return env


def _refusal(env: dict[str, str], *args: str) -> str:
    """Run a memgate command expected to refuse: exit 1, one line on stderr, no traceback."""
    done = subprocess.run(  # noqa: S603 (our own CLI)
        [*MEMGATE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_self_signed_https_with_workers(root: Path) -> None:
    """The certificate is made in the data dir, its fingerprint printed is the one served, every
    answer carries HSTS, `memgate token` trusts it, and the embedded default needs no
    MEMGATE_KEY_ENCRYPTION_KEY."""
    data_dir, port = root / "data", _free_port()
    cert_file = data_dir / "tls" / "self-signed.crt"
    env = _env(data_dir, port, MEMGATE_TLS="self-signed")
    server = TlsServer(data_dir, port, env, serve_args=("--workers", "2"), ca=cert_file)
    try:
        server.start()
        _all_workers_up(server)
        banner = server.output.read_text()
        assert f"memgate is ready at https://127.0.0.1:{port}" in banner
        printed = re.search(r"SHA-256 fingerprint: ([0-9A-F:]{95})", banner)
        assert printed is not None, banner
        served = server.served_certificate()
        assert _sha256(served) == printed.group(1) == _sha256(cert_file.read_text())

        health = httpx.get(f"{server.url}/healthz", verify=_trusting(cert_file), timeout=10)
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        assert health.headers["strict-transport-security"] == HSTS
        token = server.run("token")
        assert token.returncode == 0, token.stderr
        listed = httpx.get(
            f"{server.url}/v1/principals",
            headers={"Authorization": f"Bearer {token.stdout.strip()}"},
            verify=_trusting(cert_file),
            timeout=10,
        )
        assert listed.status_code == 200, listed.text
        assert listed.headers["strict-transport-security"] == HSTS
        denied = httpx.get(f"{server.url}/v1/principals", verify=_trusting(cert_file), timeout=10)
        assert denied.status_code == 401
        assert denied.headers["strict-transport-security"] == HSTS
        assert server.run("healthcheck").returncode == 0
        with pytest.raises(httpx.ConnectError):  # no CA trusts it but its own file
            httpx.get(f"{server.url}/healthz", timeout=10)
    finally:
        server.kill_everything()
    assert "Traceback" not in server.output.read_text()


def test_migrate_then_serve_no_migrate_as_the_app_login(database_url: str, root: Path) -> None:
    """The migration Job (owner's URL) makes keys and the bootstrap admin with the id and secret
    the operator supplied (the chart's Secret: the Job's data dir dies with it), writing and
    printing no secret; a pod with the app's login alone and certificate files given serves
    them: ready, tokens issued to those credentials and verified."""
    kek = base64.urlsafe_b64encode(os.urandom(32)).decode()
    app_url, data_dir, port = app_login(database_url), root / "data", _free_port()
    client_id, secret = (
        str(uuid.uuid4()),
        "supplied-" + base64.urlsafe_b64encode(os.urandom(30)).decode(),
    )
    migrated = subprocess.run(  # noqa: S603 (our own CLI)
        [*MEMGATE, "migrate"],
        check=False,
        env=_env(
            data_dir,
            port,
            DATABASE_URL=app_url,
            MEMGATE_MIGRATION_DATABASE_URL=database_url,
            MEMGATE_KEY_ENCRYPTION_KEY=kek,
            MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID=client_id,
            MEMGATE_BOOTSTRAP_ADMIN_SECRET=secret,
        ),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert "migrations at head" in migrated.stdout
    assert f"bootstrap admin client {client_id} " in migrated.stdout
    assert secret not in migrated.stdout + migrated.stderr
    assert not (data_dir / "admin-client.secret").exists()

    given = self_signed(root / "given", ["localhost", "127.0.0.1", "::1"])
    env = _env(
        data_dir,
        port,
        DATABASE_URL=app_url,
        MEMGATE_KEY_ENCRYPTION_KEY=kek,
        MEMGATE_TLS_CERT_FILE=str(given.cert_file),
        MEMGATE_TLS_KEY_FILE=str(given.key_file),
    )
    server = TlsServer(data_dir, port, env, serve_args=("--no-migrate", "--workers", "1"))
    server.ca = given.cert_file
    try:
        server.start()  # /readyz answered 200: the login is the app's, the schema at head
        assert _sha256(server.served_certificate()) == given.fingerprint
        assert json.loads((data_dir / "admin-client.json").read_text())["client_id"] == client_id
        issued = httpx.post(
            f"{server.url}/oauth/token",
            data={"grant_type": "client_credentials"},
            auth=(client_id, secret),
            verify=_trusting(given.cert_file),
            timeout=10,
        )
        assert issued.status_code == 200, issued.text
        assert issued.headers["strict-transport-security"] == HSTS
        listed = httpx.get(
            f"{server.url}/v1/principals",
            headers={"Authorization": f"Bearer {issued.json()['access_token']}"},
            verify=_trusting(given.cert_file),
            timeout=10,
        )
        assert listed.status_code == 200, listed.text
        assert len(listed.json()["items"]) >= 1
    finally:
        server.kill_everything()
    output = server.output.read_text()
    assert "Traceback" not in output, output
    assert "ERROR" not in output, output
    assert secret not in output


def test_serve_no_migrate_refuses_an_unmigrated_database(pg_server: str, root: Path) -> None:
    name = f"t_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        empty = with_database(pg_server, name)
        app_login(empty)  # the cluster's app login exists; this database has no schema
        env = _env(
            root / "data",
            _free_port(),
            DATABASE_URL=app_login_url(empty),
            MEMGATE_KEY_ENCRYPTION_KEY=base64.urlsafe_b64encode(os.urandom(32)).decode(),
        )
        line = _refusal(env, "serve", "--no-migrate")
        assert line == (
            "memgate serve --no-migrate: the database has no memgate schema; run `memgate "
            "migrate` first (as the owner, MEMGATE_MIGRATION_DATABASE_URL, with the same "
            "MEMGATE_KEY_ENCRYPTION_KEY)."
        )
        with psycopg.connect(empty, autocommit=True) as conn:  # nothing was made
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone()
        assert tables == (0,)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_plain_http_on_every_address_and_a_shared_database_without_the_key_are_refused(
    root: Path,
) -> None:
    """Both before anything starts: no database, no data dir."""
    data_dir = root / "data"
    line = _refusal(_env(data_dir, _free_port(), MEMGATE_HOST="0.0.0.0"), "serve")  # noqa: S104
    assert line.startswith("memgate serve: refusing plain HTTP on 0.0.0.0, which is not loopback")
    assert "MEMGATE_ALLOW_PLAIN_HTTP=1" in line
    shared = _env(data_dir, _free_port(), DATABASE_URL="postgresql://memgate_api@127.0.0.1:9/x")
    for command in (("serve",), ("migrate",), ("keys", "rotate")):
        line = _refusal(shared, *command)
        assert line.startswith(
            "memgate: DATABASE_URL is set but MEMGATE_KEY_ENCRYPTION_KEY is not"
        ), line
    assert not data_dir.exists()  # no key file was made behind the refusal
