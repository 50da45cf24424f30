"""HTTPS for `memgate serve` without a proxy in front: the certificate it serves, a self-signed
development certificate when asked for one, and the rule that plain HTTP stays on loopback.

The self-signed certificate lives in `<data dir>/tls/` (both files 0600) and is reused on
restart, so a client that pinned its fingerprint keeps working; it is made again only when it is
about to expire or no longer names a host the server answers as (the public URL changed).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.settings import ServerSettings, Settings

TLS_DIR = "tls"
CERT_FILE = "self-signed.crt"
KEY_FILE = "self-signed.key"
VALID_DAYS = 365
RENEW_BEFORE_DAYS = 30
"""A self-signed certificate this close to its end is made again at start."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class PlainHttpRefused(SystemExit):
    """`serve` was asked to listen on a non-loopback host without TLS."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"memgate serve: refusing plain HTTP on {host}, which is not loopback: set "
            "MEMGATE_TLS_CERT_FILE and MEMGATE_TLS_KEY_FILE (or MEMGATE_TLS=self-signed), or "
            "MEMGATE_ALLOW_PLAIN_HTTP=1 behind a proxy or Ingress that terminates TLS."
        )


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def check_plain_http(server: ServerSettings) -> None:
    """Raise PlainHttpRefused unless TLS is on, the host is loopback, or plain HTTP is allowed."""
    if not server.tls_enabled and not server.allow_plain_http and not is_loopback(server.host):
        raise PlainHttpRefused(server.host)


@dataclass(frozen=True)
class SelfSigned:
    cert_file: Path
    key_file: Path
    fingerprint: str
    """SHA-256 of the certificate (DER), colon-separated hex, as browsers and openssl show it."""


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def certificate_hosts(server: ServerSettings) -> list[str]:
    """The names the certificate must carry: loopback, the bound host, the public URL's host."""
    hosts = list(LOOPBACK_NAMES)
    public_host = urlsplit(server.public_url).hostname
    for host in (server.host, public_host):
        if host and host not in hosts and not _is_unspecified(host):
            hosts.append(host)
    return hosts


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified  # 0.0.0.0 or :: names no host
    except ValueError:
        return False


def self_signed(data_dir: Path, hosts: list[str]) -> SelfSigned:
    """The development certificate in `data_dir/tls/`: reused when it is still valid for a while
    and names every host in `hosts`, otherwise made (with a new P-256 key)."""
    folder = data_dir / TLS_DIR
    cert_file, key_file = folder / CERT_FILE, folder / KEY_FILE
    cert = _reusable(cert_file, key_file, hosts)
    if cert is None:
        cert = _make(cert_file, key_file, hosts)
    return SelfSigned(cert_file, key_file, fingerprint(cert))


def _reusable(cert_file: Path, key_file: Path, hosts: list[str]) -> x509.Certificate | None:
    """The pair found in the data dir, if it may be served again: both files private to this
    user, the key the certificate's own (serve killed between `_make`'s two renames left a new
    key beside the old certificate, and every later start died on ssl's mismatch), still valid
    for a while and naming every host. Anything else is made again."""
    if not (_private_file(cert_file) and _private_file(key_file)):
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound):
        return None  # unreadable or not ours: a new pair
    if key.public_key() != cert.public_key():
        return None
    renew_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=RENEW_BEFORE_DAYS)
    if cert.not_valid_after_utc < renew_at:
        return None
    carried = {str(name) for name in names.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in names.get_values_for_type(x509.IPAddress)
    }
    if not all(_normal(host) in carried for host in hosts):
        return None
    return cert


def _private_file(path: Path) -> bool:
    """A regular file (not a link), this user's, readable by nobody else: a key found readable
    by others (restored from a backup, copied under umask 022) may have been read, so it is
    not served again."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    return (
        stat.S_ISREG(found.st_mode)
        and found.st_uid == os.getuid()
        and stat.S_IMODE(found.st_mode) & 0o077 == 0
    )


def _normal(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _make(cert_file: Path, key_file: Path, hosts: list[str]) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "memgate development")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a client's clock a little behind
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        # Both key identifiers: strict verifiers (Python 3.13's default context) want them.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _write_private(
        key_file,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    _write_private(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return cert


def _write_private(path: Path, content: bytes) -> None:
    """Mode 0600 from the start (no window where the key is readable), replacing atomically.
    The partial file is made afresh (O_EXCL, O_NOFOLLOW): a leftover one kept its own mode, and
    a symlink there sent the key wherever it pointed. The folder is this user's alone."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.stat().st_uid == os.getuid():
        folder.chmod(0o700)
    partial = path.with_suffix(path.suffix + ".new")
    partial.unlink(missing_ok=True)  # a link is removed, not followed
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(content)
    partial.replace(path)


def check_certificate_files(server: ServerSettings) -> None:
    """Load the certificate and key once, before anything starts: a missing file, a wrong
    password-protected key or a key that does not match stops `serve` with one line (in a
    worker it would be a traceback per worker)."""
    if not server.tls_cert_file:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            server.tls_cert_file, server.tls_key_file, password=lambda: b""
        )
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SystemExit(
            f"memgate serve: cannot serve TLS with MEMGATE_TLS_CERT_FILE={server.tls_cert_file} "
            f"and MEMGATE_TLS_KEY_FILE={server.tls_key_file}: {reason}"
        ) from None


def with_tls_files(settings: Settings) -> tuple[Settings, SelfSigned | None]:
    """The settings `serve` listens with: for MEMGATE_TLS=self-signed, the certificate files
    made (or reused) here, so every worker serves the same one."""
    server = settings.server
    if server.tls != "self-signed":
        return settings, None
    made = self_signed(settings.database.data_dir, certificate_hosts(server))
    files = replace(
        server, tls="", tls_cert_file=str(made.cert_file), tls_key_file=str(made.key_file)
    )
    check_certificate_files(files)  # the pair made or reused loads, or one line
    return replace(settings, server=files), made
