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
    events: Iterable[dict[str, Any]], checkpoint: dict[str, Any] | None = None
) -> Verdict:
    """Walk the export in order from seq 1 (genesis): an export that starts later cannot show
    that nothing before it was removed. A checkpoint beyond the export's last row means rows
    are missing (a truncated tail, or an incomplete export)."""
    checked = 0
    previous: dict[str, Any] | None = None
    hashes: dict[int, str] = {}
    for event in events:
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
    if row_hash(event) != event["row_hash"]:
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


def run(export_path: str, checkpoint_path: str | None, keys_path: str | None) -> int:
    """The command: prints a JSON verdict; exit status 0 when everything verified."""
    with open(export_path, encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    checkpoint: dict[str, Any] | None = None
    if checkpoint_path:
        with open(checkpoint_path, encoding="utf-8") as handle:
            document = json.load(handle)
        if not keys_path:
            print(json.dumps({"ok": False, "reason": "a checkpoint needs --keys to be checked"}))
            return 2
        with open(keys_path, encoding="utf-8") as handle:
            claims = checkpoint_claims(document["jws"], json.load(handle))
        tenants = {event["tenant_id"] for event in events}
        if claims is None or (tenants and claims.get("tenant") not in tenants):
            print(json.dumps({"ok": False, "reason": "checkpoint_signature_invalid"}))
            return 1
        checkpoint = {"seq": claims["seq"], "hash": claims["hash"]}
    verdict = verify_events(events, checkpoint)
    print(json.dumps(verdict.as_dict()))
    return 0 if verdict.ok else 1
