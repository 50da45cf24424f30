"""HTTPS without a proxy: the self-signed development certificate (names, mode, reuse), the
rule that plain HTTP stays on loopback, https as the default public URL with TLS, and HSTS only
when serve terminates TLS."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from litestar import Litestar
from litestar.testing import AsyncTestClient

from service.http.headers import security_headers
from service.http.tls import (
    PlainHttpRefused,
    certificate_hosts,
    check_certificate_files,
    check_plain_http,
    is_loopback,
    self_signed,
)
from service.settings import ServerSettings

EVERY_ADDRESS = "0.0.0.0"  # noqa: S104 (a setting under test: nothing here binds it)


def _names(cert_file: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n) for n in sans.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
    }


def test_the_self_signed_certificate_names_loopback_and_the_public_host(tmp_path: Path) -> None:
    server = ServerSettings(
        host=EVERY_ADDRESS, public_url="https://memgate.example:8443", tls="self-signed"
    )
    hosts = certificate_hosts(server)
    assert hosts == ["localhost", "127.0.0.1", "::1", "memgate.example"]  # 0.0.0.0 names no host
    made = self_signed(tmp_path, hosts)
    assert _names(made.cert_file) == {"localhost", "127.0.0.1", "::1", "memgate.example"}
    for path in (made.cert_file, made.key_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(made.cert_file.read_bytes())
    assert made.fingerprint == cert.fingerprint(hashes.SHA256()).hex(":").upper()
    assert len(made.fingerprint.split(":")) == 32


def test_the_self_signed_certificate_is_reused_until_a_host_is_missing(tmp_path: Path) -> None:
    first = self_signed(tmp_path, ["localhost", "127.0.0.1", "::1"])
    again = self_signed(tmp_path, ["localhost", "127.0.0.1", "::1"])
    assert again.fingerprint == first.fingerprint
    assert again.key_file.read_bytes() == first.key_file.read_bytes()
    moved = self_signed(tmp_path, ["localhost", "127.0.0.1", "::1", "api.example"])
    assert moved.fingerprint != first.fingerprint
    assert "api.example" in _names(moved.cert_file)


HOSTS = ["localhost", "127.0.0.1", "::1"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_leftover_partial_file_does_not_make_the_new_key_readable(tmp_path: Path) -> None:
    """`<file>.new` was opened without O_EXCL: a leftover one kept its 0644."""
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o755)
    leftover = tls / "self-signed.key.new"
    leftover.write_bytes(b"")
    leftover.chmod(0o644)
    made = self_signed(tmp_path, HOSTS)
    assert _mode(made.key_file) == _mode(made.cert_file) == 0o600
    assert _mode(tls) == 0o700
    assert not leftover.exists()


def test_a_partial_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.pem"
    elsewhere.write_bytes(b"")
    (tls / "self-signed.key.new").symlink_to(elsewhere)
    made = self_signed(tmp_path, HOSTS)
    assert elsewhere.read_bytes() == b"", "the private key went through a symlink"
    assert not made.key_file.is_symlink()
    assert _mode(made.key_file) == 0o600


def test_a_key_found_readable_by_others_is_made_again(tmp_path: Path) -> None:
    first = self_signed(tmp_path, HOSTS)
    first.key_file.chmod(0o644)  # restored from a backup, copied under umask 022
    again = self_signed(tmp_path, HOSTS)
    assert _mode(again.key_file) == 0o600
    assert again.fingerprint != first.fingerprint  # it may have been read: a new key


def test_a_torn_pair_is_made_again_and_a_made_pair_is_checked(tmp_path: Path) -> None:
    """serve killed between `_make`'s two renames left a new key beside the old certificate;
    it was reused, and every later serve died on ssl's KEY_VALUES_MISMATCH traceback."""
    made = self_signed(tmp_path / "data", HOSTS)
    other = self_signed(tmp_path / "other", HOSTS)
    made.key_file.write_bytes(other.key_file.read_bytes())
    again = self_signed(tmp_path / "data", HOSTS)
    assert again.fingerprint not in {made.fingerprint, other.fingerprint}
    check_certificate_files(
        ServerSettings(tls_cert_file=str(again.cert_file), tls_key_file=str(again.key_file))
    )
    assert self_signed(tmp_path / "data", HOSTS).fingerprint == again.fingerprint  # reused


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_plain_http_on_loopback_is_fine(host: str) -> None:
    assert is_loopback(host)
    check_plain_http(ServerSettings(host=host))


@pytest.mark.parametrize("host", [EVERY_ADDRESS, "::", "10.1.2.3", "memgate.internal"])
def test_plain_http_elsewhere_is_refused_unless_allowed(host: str) -> None:
    with pytest.raises(PlainHttpRefused) as refused:
        check_plain_http(ServerSettings(host=host))
    assert "MEMGATE_ALLOW_PLAIN_HTTP=1" in str(refused.value.code)
    assert "\n" not in str(refused.value.code)
    check_plain_http(ServerSettings(host=host, allow_plain_http=True))
    check_plain_http(ServerSettings(host=host, tls="self-signed"))
    check_plain_http(ServerSettings(host=host, tls_cert_file="c.pem", tls_key_file="k.pem"))


def test_public_url_defaults_to_https_with_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMGATE_PUBLIC_URL", "MEMGATE_TLS_CERT_FILE", "MEMGATE_TLS_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEMGATE_PORT", "8443")
    monkeypatch.setenv("MEMGATE_TLS", "self-signed")
    assert ServerSettings.from_env().public_url == "https://127.0.0.1:8443"
    monkeypatch.setenv("MEMGATE_TLS", "off")
    assert ServerSettings.from_env().public_url == "http://127.0.0.1:8443"
    monkeypatch.setenv("MEMGATE_TLS_CERT_FILE", "/certs/tls.crt")
    monkeypatch.setenv("MEMGATE_TLS_KEY_FILE", "/certs/tls.key")
    assert ServerSettings.from_env().public_url == "https://127.0.0.1:8443"


@pytest.mark.parametrize("host", [EVERY_ADDRESS, "::"])
def test_on_every_address_the_default_public_url_is_one_the_certificate_names(
    host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEMGATE_HOST=0.0.0.0 (the image's default) made public_url https://0.0.0.0:8080, which
    the banner printed and `memgate token` used, while the certificate named loopback only."""
    for name in ("MEMGATE_PUBLIC_URL", "MEMGATE_TLS_CERT_FILE", "MEMGATE_TLS_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEMGATE_HOST", host)
    monkeypatch.setenv("MEMGATE_PORT", "8443")
    monkeypatch.setenv("MEMGATE_TLS", "self-signed")
    server = ServerSettings.from_env()
    assert server.public_url == "https://localhost:8443"
    made = self_signed(tmp_path, certificate_hosts(server))
    assert "localhost" in _names(made.cert_file)


def test_tls_settings_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="go together"):
        ServerSettings(tls_cert_file="c.pem")
    with pytest.raises(ValueError, match="exclude each other"):
        ServerSettings(tls="self-signed", tls_cert_file="c.pem", tls_key_file="k.pem")
    with pytest.raises(ValueError, match="MEMGATE_TLS must be"):
        ServerSettings(tls="yes")


@pytest.mark.parametrize("tls", [True, False])
async def test_hsts_is_on_every_answer_with_tls_and_never_without(tls: bool) -> None:
    app = Litestar(route_handlers=[])
    app.asgi_handler = security_headers(app.asgi_handler, hsts=tls)  # as create_app wires it
    async with AsyncTestClient(app=app) as client:
        answer = await client.get("/nowhere")  # an answer Litestar's router makes
    assert answer.status_code == 404
    if tls:
        assert answer.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains"
    else:
        assert "strict-transport-security" not in answer.headers


def test_certificate_files_that_cannot_serve_stop_serve_with_one_line(tmp_path: Path) -> None:
    made = self_signed(tmp_path, ["localhost"])
    other = self_signed(tmp_path / "other", ["localhost"])
    check_certificate_files(
        ServerSettings(tls_cert_file=str(made.cert_file), tls_key_file=str(made.key_file))
    )
    cases = {
        "No such file or directory": (str(tmp_path / "missing.crt"), str(made.key_file)),
        "KEY_VALUES_MISMATCH": (str(made.cert_file), str(other.key_file)),
    }
    for reason, (cert, key) in cases.items():
        with pytest.raises(SystemExit) as refused:
            check_certificate_files(ServerSettings(tls_cert_file=cert, tls_key_file=key))
        message = str(refused.value.code)
        assert message.startswith("memgate serve: cannot serve TLS with MEMGATE_TLS_CERT_FILE=")
        assert reason in message
        assert "\n" not in message
