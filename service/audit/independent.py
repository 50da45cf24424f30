"""`memgate audit verify`: check an audit export without the service's code or database.

Deliberately shares nothing with the append path (the SQL functions `audit_append` and
`audit_canonical`) or with the server-side verifier: it re-implements the canonical layout from
its written description (docs/audit.md) with the standard library only, plus joserfc to check
checkpoint signatures. If the two implementations ever disagree, a test fails.

Input: the NDJSON of `GET /v1/audit/export` (one tenant, any contiguous range), optionally the
JSON of `GET /v1/audit/checkpoints/latest` and the JWKS of `GET /v1/audit/keys`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ZERO_HASH = "00" * 32
_STRING_FIELDS = (
    "request_id",
    "trace_id",
    "actor",
    "client_id",
)
# What each field of an appended row holds (docs/audit.md). A row that departs from it was not
# written by the append function, whatever its hash says: the layout encodes a null as "-", so
# a nulled field with its hash recomputed would otherwise pass.
_TEXT = (str,)
_OPTIONAL_TEXT = (str, type(None))
_SHAPE: dict[str, tuple[type, ...]] = {
    "tenant_id": _TEXT,
    "at": _TEXT,
    "request_id": _TEXT,
    "trace_id": _OPTIONAL_TEXT,
    "actor": _OPTIONAL_TEXT,
    "client_id": _OPTIONAL_TEXT,
    "token_id": _OPTIONAL_TEXT,
    "issuer": _OPTIONAL_TEXT,
    "method": _TEXT,
    "route": _TEXT,
    "action": _TEXT,
    "decision": _TEXT,
    "reason": _TEXT,
    "prev_hash": _TEXT,
    "row_hash": _TEXT,
}
_INTEGERS = {"status": False, "latency_us": False, "result_count": True, "policy_version": True}
_TEXT_LISTS = ("delegation", "scopes", "target_ids")
_HEX_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    checked: int
    first_bad_seq: int | None
    reason: str | None
    last_seq: int | None
    last_hash: str | None
    checkpoint_confirmed: bool | None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _field(value: object) -> str:
    if value is None:
        return "-"
    text = str(value)
    return f"{len(text.encode())}:{text}"


def _array(values: list[Any] | None) -> str:
    if values is None:
        return "-"
    return f"[{len(values)}]" + "".join(_field(v) for v in values)


def _micros(at: str) -> int:
    moment = datetime.fromisoformat(at.replace("Z", "+00:00"))
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _instant(at: str) -> bool:
    """An RFC 3339 time with an offset (a naive time names no instant: its hash is undefined)."""
    try:
        return datetime.fromisoformat(at.replace("Z", "+00:00")).utcoffset() is not None
    except ValueError:
        return False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def well_formed(event: dict[str, Any]) -> bool:
    """Every field present with the type the append function gives it (nulls only where the
    layout allows them), hashes as 64 lowercase hex digits, `at` an instant."""
    if not _is_int(event.get("seq")):
        return False
    for name, types in _SHAPE.items():
        if name not in event or not isinstance(event[name], types):
            return False
    for name, nullable in _INTEGERS.items():
        value = event.get(name, False)
        if not (_is_int(value) or (nullable and name in event and value is None)):
            return False
    for name in _TEXT_LISTS:
        values = event.get(name)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return False
    return (
        bool(_HEX_HASH.fullmatch(event["prev_hash"]))
        and bool(_HEX_HASH.fullmatch(event["row_hash"]))
        and _instant(event["at"])
    )


def canonical(event: dict[str, Any]) -> bytes:
    """The layout of docs/audit.md, field by field."""
    parts = [
        "memgate.audit.v1",
        _field(event["tenant_id"]),
        _field(event["seq"]),
        _field(_micros(event["at"])),
        *(_field(event[name]) for name in _STRING_FIELDS),
        _array(event["delegation"]),
        _field(event["token_id"]),
        _field(event["issuer"]),
        _array(event["scopes"]),
        _field(event["method"]),
        _field(event["route"]),
        _field(event["action"]),
        _array(event["target_ids"]),
        _field(event["result_count"]),
        _field(event["decision"]),
        _field(event["reason"]),
        _field(event["status"]),
        _field(event["latency_us"]),
        _field(event["policy_version"]),
    ]
    return "".join(parts).encode()


def row_hash(event: dict[str, Any]) -> str:
    return hashlib.sha256(bytes.fromhex(event["prev_hash"]) + canonical(event)).hexdigest()


def verify_events(
    events: Iterable[object],
    checkpoint: dict[str, Any] | None = None,
    known: tuple[int, str] | None = None,
) -> Verdict:
    """Walk the export in order from seq 1 (genesis): an export that starts later cannot show
    that nothing before it was removed. A checkpoint beyond the export's last row means rows
    are missing (a truncated tail, or an incomplete export). A line that is not a row with a
    number at all is `malformed_row` at the number it should have had. `known` is a (seq, hex
    hash) held from elsewhere (an `Audit-Receipt`): the export must hold that very row, or it
    is `missing_row` (beyond the last row) or `known_head_mismatch`."""
    checked = 0
    previous: dict[str, Any] | None = None
    hashes: dict[int, str] = {}
    for item in events:
        if not isinstance(item, dict) or not _is_int(item.get("seq")):
            expected = (_seq(previous) or 0) + 1
            return Verdict(
                False, checked, expected, "malformed_row", _seq(previous), _hash(previous), None
            )
        event = cast("dict[str, Any]", item)
        seq = int(event["seq"])
        bad = _judge(event, previous)
        if bad is not None:
            return Verdict(False, checked, bad[0], bad[1], _seq(previous), _hash(previous), None)
        hashes[seq] = event["row_hash"]
        previous = event
        checked += 1
    confirmed = None
    if checkpoint is not None:
        at = hashes.get(int(checkpoint["seq"]))
        confirmed = at is not None and at == checkpoint["hash"]
        if at is None:
            last = _seq(previous) or 0
            return Verdict(False, checked, last + 1, "missing_row", _seq(previous), None, False)
        if not confirmed:
            return Verdict(
                False,
                checked,
                int(checkpoint["seq"]),
                "checkpoint_mismatch",
                _seq(previous),
                _hash(previous),
                False,
            )
    if known is not None:
        held = hashes.get(known[0])
        last = _seq(previous) or 0
        if held is None:
            seq = last + 1 if last < known[0] else known[0]
            return Verdict(False, checked, seq, "missing_row", _seq(previous), None, confirmed)
        if held != known[1]:
            return Verdict(
                False,
                checked,
                known[0],
                "known_head_mismatch",
                _seq(previous),
                _hash(previous),
                confirmed,
            )
    return Verdict(True, checked, None, None, _seq(previous), _hash(previous), confirmed)


def _judge(event: dict[str, Any], previous: dict[str, Any] | None) -> tuple[int, str] | None:
    """The same order of checks as the server: numbering, the row's own hash, then its link."""
    seq = int(event["seq"])
    if previous is None and seq != 1:
        return 1, "missing_row"
    if previous is not None:
        before = int(previous["seq"])
        if seq == before:
            return seq, "duplicate_seq"
        if seq != before + 1:
            return before + 1, "missing_row"
    if not well_formed(event) or row_hash(event) != event["row_hash"]:
        return seq, "row_hash_mismatch"
    expected_prev = _ZERO_HASH if previous is None else previous["row_hash"]
    if event["prev_hash"] != expected_prev:
        return seq, "chain_broken"
    return None


def _seq(event: dict[str, Any] | None) -> int | None:
    return int(event["seq"]) if event else None


def _hash(event: dict[str, Any] | None) -> str | None:
    return str(event["row_hash"]) if event else None


def checkpoint_claims(checkpoint_jws: str, jwks: dict[str, Any]) -> dict[str, Any] | None:
    """The signed claims of a checkpoint, or None when no key of `jwks` signed it."""
    from joserfc import jws
    from joserfc.errors import JoseError
    from joserfc.jwk import KeySet, KeySetSerialization

    try:
        verified = jws.deserialize_compact(
            checkpoint_jws,
            KeySet.import_key_set(cast("KeySetSerialization", jwks)),
            algorithms=["Ed25519"],
        )
        claims: dict[str, Any] = json.loads(verified.payload)
    except (JoseError, ValueError):
        return None
    return claims


def parse_head(text: str) -> tuple[int, str] | None:
    """`SEQ:HASH` (the two fields of an `Audit-Receipt`), else None."""
    seq, _, digest = text.strip().partition(":")
    if not seq.isdigit() or not _HEX_HASH.fullmatch(digest):
        return None
    return int(seq), digest


class InputError(Exception):
    """An input file the verifier cannot use: which one (`export`, `--checkpoint`, `--keys`),
    where it is, and what is wrong with it."""

    def __init__(self, which: str, path: str, detail: str):
        super().__init__(detail)
        self.which, self.path, self.detail = which, path, detail

    def verdict(self) -> dict[str, Any]:
        return {
            "ok": False,
            "reason": "unreadable_input",
            "file": self.which,
            "path": self.path,
            "detail": self.detail,
        }


def _read(which: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        detail = f"cannot be read ({exc.strerror or type(exc).__name__})"
        raise InputError(which, path, detail) from None


def _json_object(which: str, path: str) -> dict[str, Any]:
    try:
        document = json.loads(_read(which, path))
    except (ValueError, RecursionError):
        raise InputError(which, path, "is not JSON") from None
    if not isinstance(document, dict):
        raise InputError(which, path, "is not a JSON object")
    return cast("dict[str, Any]", document)


def _checkpoint_jws(path: str) -> str:
    """The `jws` of a `GET /v1/audit/checkpoints/latest` answer."""
    document = _json_object("--checkpoint", path)
    compact = document.get("jws")
    if not isinstance(compact, str):
        raise InputError(
            "--checkpoint", path, "has no 'jws' string (save GET /v1/audit/checkpoints/latest)"
        )
    return compact


def _jwks(path: str) -> dict[str, Any]:
    """A `GET /v1/audit/keys` answer: an object with a list of key objects."""
    document = _json_object("--keys", path)
    keys = document.get("keys")
    if not isinstance(keys, list):
        raise InputError("--keys", path, "has no 'keys' list (save GET /v1/audit/keys)")
    if not all(isinstance(key, dict) and isinstance(key.get("kty"), str) for key in keys):
        raise InputError("--keys", path, "is not a JWKS: every key must be an object with 'kty'")
    return document


def run(
    export_path: str, checkpoint_path: str | None, keys_path: str | None, head: str | None = None
) -> int:
    """The command: prints a JSON verdict; exit status 0 when everything verified, 1 when
    something did not, 2 when an input cannot be used (the verdict names the file and why)."""
    known = parse_head(head) if head is not None else None
    if head is not None and known is None:
        print(json.dumps({"ok": False, "reason": "--head must be SEQ:HASH (64 lowercase hex)"}))
        return 2
    if checkpoint_path and not keys_path:
        print(json.dumps({"ok": False, "reason": "a checkpoint needs --keys to be checked"}))
        return 2
    try:
        lines = _read("export", export_path).splitlines()
        checkpoint_jws = _checkpoint_jws(checkpoint_path) if checkpoint_path else None
        jwks = _jwks(keys_path) if checkpoint_path and keys_path else None
    except InputError as refused:
        print(json.dumps(refused.verdict()))
        return 2
    events = [_parsed(line) for line in lines if line.strip()]
    checkpoint: dict[str, Any] | None = None
    if checkpoint_jws is not None and jwks is not None:
        claims = _checkpoint_claims_safely(checkpoint_jws, jwks)
        tenants = {e.get("tenant_id") for e in events if isinstance(e, dict)}
        if (
            claims is None
            or not _is_int(claims.get("seq"))
            or not isinstance(claims.get("hash"), str)
            or (tenants and claims.get("tenant") not in tenants)
        ):
            print(json.dumps({"ok": False, "reason": "checkpoint_signature_invalid"}))
            return 1
        checkpoint = {"seq": claims["seq"], "hash": claims["hash"]}
    verdict = verify_events(events, checkpoint, known)
    print(json.dumps(verdict.as_dict()))
    return 0 if verdict.ok else 1


def _checkpoint_claims_safely(compact: str, jwks: dict[str, Any]) -> dict[str, Any] | None:
    """`checkpoint_claims`, with a key set joserfc cannot import (a key of an unknown type or
    with missing members) treated as one that signed nothing."""
    try:
        return checkpoint_claims(compact, jwks)
    except (KeyError, TypeError, AttributeError):
        return None


def _parsed(line: str) -> object:
    """One line of the export; None when it is not JSON (judged as a malformed row). Nesting
    too deep for the parser (`[` * 200000) is malformed too, not a RecursionError traceback."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None
