"""Erasure: plan, re-plan, execute, finalise and prove. No HTTP types, no commits: the call owns
the transaction (the finalisation is a call of its own, after the execution's commit).

An erasure reaches, in the whole tenant: the rows filed under its subjects, the rows its owner
principals wrote (under any subject, in any space), the rows named by id, every other version
of those rows' keys, and every row derived from any of them, transitively. Rows elsewhere that
mention one of its names are listed for review, never erased by the plan. docs/erasure.md.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from joserfc import jws
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.checkpoints import ALGORITHM, signing_key
from service.auth.principal import Principal
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import ErasurePlan
from service.erasure import repository
from service.erasure.files import (
    MAX_NEEDLES,
    TENANT_TABLES,
    TOUCHED_TABLES,
    Maintenance,
    scan,
)
from service.erasure.problems import ErasureCriteriaEmpty, ErasureNotFound, ErasurePlanStale
from service.erasure.schemas import (
    ErasureCreate,
    ErasurePlanOut,
    PlanCounts,
    Proof,
    Receipt,
    Row,
)
from service.identity.problems import PrincipalNotFound
from service.memory.problems import MemoryNotFound
from service.memory.service import not_found_detail
from service.problems import ServiceUnavailable
from service.revocation import repository as revocations
from service.revocation.problems import ReasonQuotesContent
from service.runtime import Runtime
from service.shredding import KeyStoreUnavailable, vault_of

LISTED_ROWS = 1000
"""Rows a plan lists per kind (every one is counted, and erased: the receipt lists them all)."""
RECEIPT_TYPE = "memgate-erasure-receipt+jws"
RECEIPT_VERSION = "memgate.erasure.receipt.v1"
GUARANTEES: dict[str, str] = {
    "rows": "deleted in one transaction: no endpoint returns them to anyone",
    "vectors": "deleted with their rows; VACUUM removes their HNSW entries",
    "lexemes": "deleted with their rows; VACUUM removes their GIN entries",
    "versions": "every version of the erased rows' keys is deleted",
    "derived": "rows derived from them (transitively) are deleted",
    "caches": "stored idempotent answers naming them and recall marks are deleted; memgate "
    "keeps no other cache of memory text or vectors",
    "pseudonym_mapping": "the owners' pseudonym -> principal rows are deleted: audit rows keep "
    "a pseudonym nobody can resolve",
    "audit": "audit rows hold ids, counts and pseudonyms, never content; they are kept",
    "wal_replicas_backups": "not reached: copies stay until WAL is recycled and backups expire; "
    "replay this receipt's ids after a restore",
    "providers": "not reached: the embedding or summarizer provider's own retention applies",
}
"""Per layer, what the execution guarantees (docs/erasure.md has the table in full)."""
_TENANT_AUDIT = {
    False: "the tenant's audit chain is kept (ids, counts, pseudonyms, never content); its "
    "actor map and pseudonym key are deleted, so no pseudonym resolves to anyone",
    True: "the tenant's audit chain (rows, head, checkpoints), actor map and pseudonym key "
    "are deleted; the deletion itself is audited in the platform chain",
}
_FILES = {
    True: "VACUUM FULL rewrites the touched tables and their indexes into new files after the "
    "commit; the proof scans the files before and after where they are local",
    False: "a plain VACUUM marks the space reusable after the commit; the bytes may stay in "
    "free space until reused (the proof's scan shows where they are local)",
}


@dataclass
class Finalisation:
    """What the execution hands its finalisation (in memory only: the needles are content)."""

    plan_id: uuid.UUID
    rewrite: bool
    needles: list[bytes] = field(repr=False)
    local: bool
    tables: tuple[str, ...] = TOUCHED_TABLES
    retried: bool = False
    """From a retried execution: the needles (content, held in memory only) are gone, so no
    second scan of the files is made."""


_COPIES_NOT_REACHED = GUARANTEES["wal_replicas_backups"]
_TENANT_COPIES = (
    "every data key of the tenant is destroyed in the deletion's transaction: the text of "
    "its sealed rows "
    "(written while crypto_shredding was on) cannot be read from WAL, replicas or backups; "
    "the text of its other rows, and every vector and lexeme, is not reached: copies stay "
    "until WAL is recycled and backups expire"
)


def _copies(keys: dict[str, Any]) -> str:
    """What the execution says of the copies of the erased text (WAL, replicas, backups)."""
    shredded, rows = keys.get("shredded_rows", 0), keys.get("rows", 0)
    if not shredded:
        return _COPIES_NOT_REACHED + " (no erased row was sealed under a key this erasure destroys)"
    whole = "every erased row's" if shredded == rows else f"{shredded} of the {rows} erased rows'"
    return (
        f"crypto-shredded: {whole} text was sealed under a data key this erasure destroys (an "
        "erased owner's, or a summary's own), "
        "destroyed in the erasure's transaction while the tenant's writes were held out: its "
        "copies in WAL, "
        "replicas and backups cannot be read any more. Their vectors and lexemes are not "
        "reached: they stay in those copies until WAL is recycled and backups expire"
        + ("" if shredded == rows else "; the other rows' text is not reached either")
    )


class ErasureService:
    def __init__(self, session: AsyncSession, runtime: Runtime, *, facts: Facts) -> None:
        self._session = session
        self._runtime = runtime
        self._facts = facts

    async def plan(self, principal: Principal, data: ErasureCreate) -> ErasurePlanOut:
        if not (data.subjects or data.owners or data.memory_ids):
            raise ErasureCriteriaEmpty(
                "Name at least one subject, owner principal or memory id to erase (names alone "
                "only find mentions to review). Nothing changed."
            )
        missing = await repository.missing_principals(
            self._session, principal.tenant_id, data.owners
        )
        if missing:
            raise PrincipalNotFound(f"No principal {missing[0]} in your tenant.")
        _refuse_names_in_reason(data.reason, data.names)
        row = ErasurePlan(
            tenant_id=principal.tenant_id,
            id=uuid7(),
            subjects=sorted(set(data.subjects)),
            owners=sorted(set(data.owners)),
            memory_ids=sorted(set(data.memory_ids)),
            names=list(dict.fromkeys(data.names)),
            name_count=len(set(data.names)),
            keep_tombstones=data.keep_tombstones,
            rewrite=data.rewrite,
            reason=data.reason,
            fingerprint=b"",
            planned_by=principal.principal_id,
        )
        self._session.add(row)
        await self._session.flush()
        reached = await repository.reach(self._session, row.id)
        named = {one.memory_id for one in reached if one.why == "id"}
        for memory_id in row.memory_ids:
            if memory_id not in named:
                raise MemoryNotFound(not_found_detail(memory_id))
        row.fingerprint = repository.fingerprint(reached)
        await self._session.flush()
        self._facts.add_targets([row.id])
        self._facts.count(sum(1 for one in reached if one.why != "mention"))
        return await self._out(row, reached)

    async def replan(self, principal: Principal, plan_id: uuid.UUID) -> ErasurePlanOut:
        row = await self._row(principal, plan_id, lock=True)
        if row.state == "executed":
            raise ErasurePlanStale(
                f"Erasure {plan_id} is executed already: there is nothing to plan again. "
                "Nothing changed."
            )
        reached = await repository.reach(self._session, row.id)
        row.version += 1
        row.fingerprint = repository.fingerprint(reached)
        row.planned_at = datetime.now(UTC)
        await self._session.flush()
        return await self._out(row, reached)

    async def get(self, principal: Principal, plan_id: uuid.UUID) -> ErasurePlanOut:
        row = await self._row(principal, plan_id)
        reached = await repository.reach(self._session, row.id) if row.state == "planned" else []
        return await self._out(row, reached)

    async def execute(
        self, principal: Principal, subject: str, plan_id: uuid.UUID, version: int
    ) -> tuple[Receipt, Finalisation | None]:
        """The receipt, and what the finalisation needs once this commits (None when the plan
        was executed already, the same receipt again, or erased nothing).

        The files are scanned before the tenant's writes are held out (a scan of a large
        cluster takes a while): the needles are the values of the rows and versions the plan
        reaches, which the fingerprint, checked under the lock, proves are what is erased."""
        peeked = await self._row(principal, plan_id)
        if peeked.state == "executed":
            return _receipt(peeked), _unfinished(peeked)
        needles = await repository.needles(self._session, principal.tenant_id, plan_id)
        wanted, total = _needle_bytes(needles)
        before: dict[str, Any] = {"scanned": False, "why": "nothing to look for"}
        local = False
        if wanted:
            before, local = await self._scan_files(wanted, TOUCHED_TABLES)
        await revocations.hold_out_writes(self._session, principal.tenant_id)
        row = await self._row(principal, plan_id, lock=True)
        if row.state == "executed":  # a concurrent execution committed first
            return _receipt(row), _unfinished(row)
        reached = await repository.reach(self._session, row.id)
        if version != row.version or repository.fingerprint(reached) != row.fingerprint:
            raise ErasurePlanStale(
                f"Erasure {plan_id} is at version {row.version}"
                + (
                    f", not {version}"
                    if version != row.version
                    else ", and what it reaches changed since it was planned"
                )
                + ". Plan it again (POST /v1/erasures/{id}/plan), review it, and execute that "
                "version. Nothing was erased."
            )
        erased = sorted(one.memory_id for one in reached if one.why != "mention")
        nearest = await repository.nearest(
            self._session,
            erased,
            [one.embedding for one in needles[:MAX_NEEDLES] if one.embedding is not None],
        )
        counts = await repository.execute(self._session, row.id)
        keys = _key_layer(needles, row.owners)
        # The data keys die with the rows, in this transaction and while the tenant's writes
        # are held out: a write that waited for the lock seals under a new key (the vault asks
        # the store, not its cache), so nothing written after the erasure is sealed under a
        # destroyed key. Every row sealed under these keys is erased here, so if the commit then
        # failed, only rows this plan erases would read empty, until it is executed again.
        destroyed = await self._destroy_keys(
            principal.tenant_id, _key_slots(erased, row.owners), whole_tenant=False
        )
        mentions_left = await repository.reach(self._session, row.id)
        left = await repository.left(self._session, erased, row.owners)
        key = await self._runtime.pseudonyms.key(self._session, principal.tenant_id)
        pseudonym = self._runtime.pseudonyms.compute
        executed_at = datetime.now(UTC)
        subjects = [pseudonym(key, one) for one in row.subjects]
        claims = {
            "v": RECEIPT_VERSION,
            "erasure": str(row.id),
            "plan_version": row.version,
            "tenant": str(principal.tenant_id),
            "requester": pseudonym(key, subject),
            "executed_at": executed_at.isoformat(),
            "criteria": {
                "subjects": subjects,
                "owners": [pseudonym(key, str(one)) for one in row.owners],
                "memory_ids": [str(one) for one in row.memory_ids],
                "names": row.name_count,
            },
            "erased": [str(one) for one in erased],
            "counts": counts,
            "tombstones_kept": row.keep_tombstones,
            "keys": keys,
            "guarantees": GUARANTEES
            | {"files": _FILES[row.rewrite], "wal_replicas_backups": _copies(keys)},
        }
        row.receipt = await self._sign(claims)
        row.state, row.executed_by, row.executed_at = (
            "executed",
            principal.principal_id,
            executed_at,
        )
        # Ids, counts and digests only from here: the subjects as their pseudonyms, no names,
        # no owner ids (the receipt's pseudonyms would resolve through them).
        row.subjects = subjects
        row.owners, row.names = [], []
        row.erased, row.counts = erased, counts
        found_before: list[int] = before.get("found", [])
        row.evidence = {
            "finalized": not erased,
            "mentions_left": len(mentions_left),
            "owned_left": left.owned,
            # Similarities only: the nearest row may be one the eraser cannot read (red team,
            # finding 4), so its id is not named.
            "nearest": [
                {"needle": ordinal, "similarity": round(similarity, 4)}
                for ordinal, _, similarity in nearest
            ],
            # The needles are the erased values only, never the plan's names: the files hold
            # every tenant's rows, and a name found there would tell of another tenant's text
            # (red team, finding 1). `found[i]` counts the files holding value i.
            "needles": {
                "values": len(wanted),
                "total": total,
                "truncated": total > len(wanted),
                # Values a scan can see at all (over ~2 kB they are stored compressed).
                "observable": sum(1 for n in found_before if n > 0),
            },
            "files_before": before,
            "keys": keys | destroyed,
        }
        await self._session.flush()
        self._facts.add_targets([row.id, *erased])
        self._facts.count(len(erased))
        if not erased:  # nothing to VACUUM: no rewrite of shared tables for an empty plan
            return _receipt(row), None
        return _receipt(row), Finalisation(row.id, row.rewrite, wanted, local)

    async def finalize(self, principal: Principal, done: Finalisation) -> None:
        """After the execution committed: VACUUM the touched tables (FULL when the plan asks),
        scan the files again for the same needles, and note it all in the plan's evidence."""
        maintenance = self._maintenance()
        vacuum = await anyio.to_thread.run_sync(
            lambda: maintenance.vacuum(done.tables, rewrite=done.rewrite)
        )
        after, _ = await self._scan_files(done.needles, done.tables) if done.local else ({}, False)
        row = await self._row(principal, done.plan_id, lock=True)
        evidence: dict[str, Any] = {
            "finalized": True,
            "vacuum": {"full": done.rewrite, "tables": vacuum, "at": datetime.now(UTC).isoformat()},
            "files_after": after or row.evidence.get("files_before", {}),
        }
        if done.retried:
            evidence["files_after"] = {
                "scanned": False,
                "why": "finished by a retried execution, which no longer holds the values",
            }
        row.evidence = row.evidence | evidence
        await self._session.flush()
        self._facts.add_targets([row.id])

    async def _destroy_keys(
        self, tenant_id: uuid.UUID, slots: Sequence[uuid.UUID], *, whole_tenant: bool
    ) -> dict[str, Any]:
        """Destroy the data keys of `slots` (or every key of the tenant) now, inside the
        erasure's transaction; answer the proof's key facts. A store that fails is a problem
        that rolls the erasure back: nothing is erased, and executing it again finishes."""
        vault = vault_of(self._session)
        try:
            if whole_tenant:
                destroyed = await vault.destroy_tenant(tenant_id)
            else:
                destroyed = await vault.destroy_owners(tenant_id, slots)
        except KeyStoreUnavailable as exc:
            raise ServiceUnavailable(
                f"The data key store did not answer while destroying the erased owners' keys "
                f"({exc}). Nothing was erased. Execute the erasure again once the store "
                "answers; until then rows it erases may already read empty."
            ) from None
        return {
            "pending": 0,
            "destroyed": len(destroyed),
            "key_ids": sorted(str(one) for one in destroyed),
            "destroyed_at": datetime.now(UTC).isoformat(),
        }

    async def proof(self, principal: Principal, plan_id: uuid.UUID) -> Proof:
        row = await self._row(principal, plan_id)
        evidence = dict(row.evidence)
        if "keys" in evidence:
            evidence["keys"] = evidence["keys"] | {"copies": _copies_now(evidence["keys"])}
        if row.state == "planned":
            reached = await repository.reach(self._session, row.id)
            ids = [one.memory_id for one in reached if one.why != "mention"]
        else:
            ids = list(row.erased)
        left = await repository.left(self._session, ids, row.owners)
        executed = row.state == "executed"
        return Proof(
            erasure_id=row.id,
            state="executed" if executed else "planned",
            checked_at=datetime.now(UTC),
            rows_left=left.rows,
            owned_left=int(row.evidence.get("owned_left", 0)) if executed else left.owned,
            vectors_left=left.vectors,
            dangling_references=left.dangling,
            evidence=evidence,
        )

    async def erase_tenant(
        self, principal: Principal, subject: str, tenant_id: uuid.UUID, *, drop_audit: bool
    ) -> tuple[uuid.UUID, Receipt, Finalisation]:
        """A tenant's deletion as an erasure (the platform admin's call, the tenant checked
        disabled and its plan confirmed by service/tenants): every row of the tenant in one
        transaction, the receipt signed and kept in the platform tenant, the files scanned
        before; the finalisation VACUUMs every tenant table and scans again."""
        values = await repository.tenant_needles(self._session, tenant_id, MAX_NEEDLES)
        wanted = list(dict.fromkeys(value.encode() for value in values))
        before, local = await self._scan_files(wanted, TENANT_TABLES)
        counts = await repository.erase_tenant(self._session, tenant_id, drop_audit=drop_audit)
        destroyed = await self._destroy_keys(tenant_id, [], whole_tenant=True)
        key = await self._runtime.pseudonyms.key(self._session, principal.tenant_id)
        executed_at = datetime.now(UTC)
        row = ErasurePlan(
            tenant_id=principal.tenant_id,
            id=uuid7(),
            reason="tenant deletion",
            fingerprint=b"",
            planned_by=principal.principal_id,
            state="executed",
            executed_by=principal.principal_id,
            executed_at=executed_at,
            erased_tenant=tenant_id,
            counts=counts,
        )
        claims = {
            "v": RECEIPT_VERSION,
            "erasure": str(row.id),
            "tenant": str(principal.tenant_id),
            "erased_tenant": str(tenant_id),
            "requester": self._runtime.pseudonyms.compute(key, subject),
            "executed_at": executed_at.isoformat(),
            "counts": counts,
            "audit_chain": "dropped" if drop_audit else "kept",
            "guarantees": GUARANTEES
            | {
                "files": _FILES[True],
                "audit": _TENANT_AUDIT[drop_audit],
                "wal_replicas_backups": _TENANT_COPIES,
            },
        }
        row.receipt = await self._sign(claims)
        row.evidence = {
            "finalized": False,
            "needles": {"values": len(wanted), "total": len(wanted), "truncated": False},
            "files_before": before,
            "keys": {"whole_tenant": True} | destroyed,
        }
        self._session.add(row)
        await self._session.flush()
        self._facts.add_targets([row.id])
        done = Finalisation(row.id, True, wanted, local, TENANT_TABLES)
        return row.id, _receipt(row), done

    async def tenant_proof(self, principal: Principal, tenant_id: uuid.UUID) -> dict[str, Any]:
        """What a tenant's erasure left, table by table, with its evidence."""
        row = await repository.tenant_erasure(self._session, principal.tenant_id, tenant_id)
        return {
            "erasure_id": None if row is None else str(row.id),
            "checked_at": datetime.now(UTC).isoformat(),
            "rows_left": await repository.tenant_left(self._session, tenant_id),
            "evidence": {} if row is None else dict(row.evidence),
        }

    async def _scan_files(
        self, needles: Sequence[bytes], tables: Sequence[str]
    ) -> tuple[dict[str, Any], bool]:
        maintenance = self._maintenance()
        directory, why = await anyio.to_thread.run_sync(maintenance.local_data_directory)
        if directory is None:
            return {"scanned": False, "why": why}, False
        if not await anyio.to_thread.run_sync(maintenance.checkpoint):
            return {"scanned": False, "why": "CHECKPOINT refused: the files may lag"}, False
        files = await anyio.to_thread.run_sync(
            lambda: maintenance.relation_files(directory, tables)
        )
        result = await anyio.to_thread.run_sync(lambda: scan(files, needles))
        return {"scanned": True} | result, True

    def _maintenance(self) -> Maintenance:
        maintenance = self._runtime.maintenance
        if maintenance is None:
            raise ServiceUnavailable("This process has no database maintenance connection.")
        return maintenance

    async def _sign(self, claims: dict[str, Any]) -> str:
        key = await signing_key(self._session, self._runtime.kek)
        if key is None:
            raise ServiceUnavailable(
                "No audit signing key is available to sign the erasure receipt: run `memgate "
                "migrate` with the owner's URL. Nothing was erased."
            )
        header = {"alg": ALGORITHM, "kid": key.kid, "typ": RECEIPT_TYPE}
        payload = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
        return jws.serialize_compact(header, payload, key, algorithms=[ALGORITHM])

    async def _row(
        self, principal: Principal, plan_id: uuid.UUID, *, lock: bool = False
    ) -> ErasurePlan:
        row = await repository.plan(self._session, principal.tenant_id, plan_id, lock=lock)
        if row is None:
            raise ErasureNotFound(f"No erasure {plan_id} in your tenant.")
        self._facts.add_targets([row.id])
        return row

    async def _out(self, row: ErasurePlan, reached: Sequence[repository.Reached]) -> ErasurePlanOut:
        lists: dict[str, list[Row]] = {why: [] for why in (*repository.ERASED_WHY, "mention")}
        counted = dict.fromkeys(lists, 0)
        for one in reached:
            counted[one.why] += 1
            if counted[one.why] <= LISTED_ROWS:
                lists[one.why].append(
                    Row(id=one.memory_id, space_id=one.space_id, version=one.version)
                )
        executed = row.state == "executed"
        return ErasurePlanOut(
            id=row.id,
            version=row.version,
            state="executed" if executed else "planned",
            planned_at=row.planned_at,
            subjects=list(row.subjects),
            owners=[str(one) for one in row.owners] if not executed else _owner_pseudonyms(row),
            memory_ids=list(row.memory_ids),
            names=row.name_count,
            keep_tombstones=row.keep_tombstones,
            rewrite=row.rewrite,
            by_id=lists["id"],
            by_subject=lists["subject"],
            by_owner=lists["owner"],
            versions=lists["version"],
            derived=lists["derived"],
            review=lists["mention"],
            counts=PlanCounts(
                by_id=counted["id"],
                by_subject=counted["subject"],
                by_owner=counted["owner"],
                versions=counted["version"],
                derived=counted["derived"],
                review=counted["mention"],
            ),
            truncated=any(n > LISTED_ROWS for n in counted.values()),
            executed_at=row.executed_at,
            receipt=row.receipt,
        )


def _unfinished(row: ErasurePlan) -> Finalisation | None:
    """For an executed plan whose finalisation never ran (the process died after the commit):
    one that VACUUMs now, without the second file scan (the values were held in memory)."""
    if row.evidence.get("finalized", True) or not row.erased:
        return None
    return Finalisation(row.id, row.rewrite, [], False, TOUCHED_TABLES, retried=True)


def _key_slots(erased: Sequence[uuid.UUID], owners: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """The data keys the erasure destroys: the erased owners', and the own key of every erased
    row that has one (a summary: `service.shredding.key_slot`). Every erased id is named, not
    only the sealed rows': an older summary version retracted to a stub has no sealed value
    left to tell, yet copies from before hold it sealed under its own key. A row without a
    key of its own costs the store one miss."""
    return sorted({*owners, *erased})


def _key_layer(needles: Sequence[repository.Needle], owners: Sequence[uuid.UUID]) -> dict[str, int]:
    """Counts, no ids: of the erased rows, how many were sealed, and how many under a key this
    erasure destroys (the ones crypto-shredding reaches in copies)."""
    destroyed = set(_key_slots([one.memory_id for one in needles], owners))
    sealed = [one for one in needles if one.sealed_by is not None]
    return {
        "rows": len(needles),
        "sealed_rows": len(sealed),
        "shredded_rows": sum(1 for one in sealed if one.sealed_by in destroyed),
        "owners": len(set(owners)),
    }


def _copies_now(keys: dict[str, Any]) -> str:
    """The proof's word on the erased text's copies in WAL, replicas and backups, today."""
    if keys.get("whole_tenant"):
        return (
            "the tenant's data keys are destroyed: the sealed text of its rows cannot be read "
            "from any copy; text of rows stored before crypto-shredding was on, vectors and "
            "lexemes are not reached"
        )
    if not keys.get("shredded_rows"):
        return "not reached: no erased row was sealed under a key this erasure destroys"
    rows, shredded = keys.get("rows", 0), keys["shredded_rows"]
    return (
        f"unreadable: the text of {shredded} of the {rows} erased rows cannot be read from any "
        "copy (its data keys are destroyed)"
        + ("" if shredded == rows else "; the other rows' text is not reached")
        + "; vectors and lexemes in copies are not reached"
    )


def _owner_pseudonyms(row: ErasurePlan) -> list[str]:
    claims = _claims(row)
    owners: list[str] = claims.get("criteria", {}).get("owners", [])
    return owners


def _claims(row: ErasurePlan) -> dict[str, Any]:
    assert row.receipt is not None
    payload = row.receipt.split(".")[1]
    padded = payload + "=" * (-len(payload) % 4)
    loaded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return loaded


def _receipt(row: ErasurePlan) -> Receipt:
    assert row.receipt is not None
    return Receipt(erasure_id=row.id, receipt=row.receipt, claims=_claims(row))


def _needle_bytes(needles: Sequence[repository.Needle]) -> tuple[list[bytes], int]:
    """The erased values (as stored: UTF-8), at most MAX_NEEDLES, and how many there were."""
    values = list(dict.fromkeys(one.value.encode() for one in needles if one.value))
    return values[:MAX_NEEDLES], len(values)


def _refuse_names_in_reason(reason: str, names: Sequence[str]) -> None:
    lowered = reason.lower()
    if any(name.lower() in lowered for name in names):
        raise ReasonQuotesContent(
            "The reason contains one of the plan's names. It is kept with the plan (the names "
            "are cleared once it is executed), so it may not name the person: give the "
            "request's reference instead. Nothing changed."
        )
