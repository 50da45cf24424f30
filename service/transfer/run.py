"""The import and export loops: streaming, resumable, with a progress line on stderr.

**Import** reads the file line by line (never the whole file), maps each line to write bodies
(formats.py) and sends them in batches of `POST /v1/memories:batch`, cut at line boundaries
(a line holding more items than a batch is spread over several). Each batch has an
`Idempotency-Key` made from the run's id (random, kept in the state file), where the batch
starts and what it holds, so sending it again — after a timeout, a dropped connection, or a
kill and a re-run — answers the stored answer instead of writing twice, while a new run of
the same file (after the last one finished) writes it again. The state file records,
atomically after every committed batch, the position after it (a byte offset of a line, and
how many items of that line are done) and, while a batch is out, its key and where it ends: a
re-run starts at that position, cuts that batch again where it ended, and neither loses nor
repeats a memory. The state file goes when the import is done.

**Export** pages `GET /v1/memories` (what the caller may read, live versions) into JSONL in the
memgate import format; the state file records the cursor of the next page and the output's
length after the last page written, so a re-run truncates a half-written page and goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from service.transfer.client import Server, TransferFailed, problem_detail
from service.transfer.formats import PROVENANCE, BadRecord, Body, Format, Skipped, records

BATCH_PATH = "/v1/memories:batch"
PAGE_SIZE = 100


@dataclass(frozen=True)
class Position:
    """Where the import stands: the line starting at byte `offset` (its number `line`), of
    which the first `done` items are written."""

    offset: int = 0
    line: int = 1
    done: int = 0


@dataclass
class Item:
    body: Body
    line: int
    after: Position
    """The position once this item is written."""
    skipped: int = 0
    """Records skipped on the lines read since the item before (counted once it is written)."""


@dataclass(frozen=True)
class Passed:
    """A line of skipped records only (or a blank one): the position after it."""

    after: Position
    skipped: int


@dataclass
class Progress:
    """One line on stderr per batch or page: count, rate and, when the size is known, ETA."""

    verb: str
    total_bytes: int | None
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    started: float = field(default_factory=time.monotonic)
    counted_at_start: int = 0
    bytes_at_start: int = 0

    def show(self, count: int, skipped: int, position: int | None) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = (count - self.counted_at_start) / elapsed
        parts = [f"memgate {self.verb}: {count} memories"]
        if skipped:
            parts[0] += f" ({skipped} skipped)"
        parts.append(f"{rate:.0f}/s")
        if self.total_bytes and position is not None:
            share = position / self.total_bytes
            parts.append(f"{share:.0%} of {self.total_bytes} bytes")
            done_now = position - self.bytes_at_start
            if done_now > 0 and share < 1:
                parts.append(f"ETA {(self.total_bytes - position) * elapsed / done_now:.0f} s")
        end = "\r" if self.stream.isatty() else "\n"
        print(", ".join(parts), end=end, file=self.stream, flush=True)


def _save(path: Path, state: dict[str, Any]) -> None:
    """Atomically: a kill leaves the old state or the new one, never half of one. The new
    state is written to a fresh file of a random name (mkstemp: O_EXCL, mode 0600), so a
    name planted in a shared directory (a symlink) is never written through, and the state
    (the file's name, the batch keys) is the owner's only, then renamed over the old one."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as out:
            json.dump(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def _create_private(path: Path) -> None:
    """`path` empty and readable by its owner only (0600 whatever the umask, an existing file
    too: an export holds every memory value the caller may read)."""
    descriptor = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
    finally:
        os.close(descriptor)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise TransferFailed(
            f"the state file {path} is not JSON ({exc}); remove it to start over"
        ) from None
    if not isinstance(loaded, dict):
        raise TransferFailed(f"the state file {path} is not an object; remove it to start over")
    return loaded


# -- import ----------------------------------------------------------------------------------


@dataclass
class ImportRun:
    server: Server
    source: Path
    fmt: Format
    state_file: Path
    space_id: str | None = None
    batch_size: int = 500
    skip_invalid: bool = False
    progress_stream: IO[str] = field(default_factory=lambda: sys.stderr)
    imported: int = 0
    replayed: int = 0
    """Of `imported`, the memories of batches an earlier attempt of this run had committed
    (the server answered their stored answers: written once, counted once)."""
    skipped: int = 0
    rejected: int = 0
    run_id: str = ""

    def run(self) -> dict[str, Any]:
        size = self.source.stat().st_size
        state = _load(self.state_file) or {}
        if state and state.get("size") != size:
            raise TransferFailed(
                f"{self.source} has changed since the interrupted import recorded in "
                f"{self.state_file} ({state.get('size')} bytes then, {size} now); remove the "
                "state file to import it from the start"
            )
        start = Position(**state.get("position", {}))
        # A run's batch keys begin with its id: a new run (no state) never takes the answers
        # an earlier, finished run of the same file left with the server for their 24 hours.
        self.run_id = str(state.get("run") or secrets.token_hex(8))
        self.imported = int(state.get("imported", 0))
        self.replayed = int(state.get("replayed", 0))
        # The batch size the server taught an earlier attempt (a 422 with `max_items`), and where
        # the batch that was out when it stopped ended: that batch is cut there again, so it is
        # sent under the same key and, if it had committed, replayed, not written twice.
        self.batch_size = min(self.batch_size, int(state.get("batch_size") or self.batch_size))
        until = state.get("in_flight_until") if state.get("in_flight") else None
        cut = None if until is None else Position(**until)
        self.skipped = int(state.get("skipped", 0))
        self.rejected = int(state.get("rejected", 0))
        progress = Progress("import", size, self.progress_stream)
        progress.counted_at_start, progress.bytes_at_start = self.imported, start.offset
        began = time.monotonic()
        position = start
        with self.source.open("rb") as stream:
            stream.seek(start.offset)
            batch: list[Item] = []
            waiting = 0  # skipped records read while a batch fills: counted with its next item
            for item in self._items(stream, start):
                if isinstance(item, Passed):
                    if batch:
                        waiting += item.skipped
                    else:  # nothing pending: the position moves past the line at once
                        position, self.skipped = item.after, self.skipped + item.skipped
                    continue
                item.skipped += waiting
                waiting = 0
                batch.append(item)
                if cut is not None and _beyond(item.after, cut):
                    cut = None  # the recorded end is not an item's end (cannot happen): as usual
                full = (item.after == cut) if cut is not None else len(batch) >= self.batch_size
                if full:
                    cut = None
                    position = self._send(batch, position, size)
                    progress.show(self.imported, self.skipped, position.offset)
                    batch = []
            if batch:
                position = self._send(batch, position, size)
                self.skipped += waiting
                progress.show(self.imported, self.skipped, position.offset)
        self.state_file.unlink(missing_ok=True)
        return {
            "imported": self.imported,
            "replayed": self.replayed,
            "skipped": self.skipped,
            "rejected": self.rejected,
            "seconds": round(time.monotonic() - began, 3),
        }

    def _items(self, stream: IO[bytes], start: Position) -> Iterator[Item | Passed]:
        now = datetime.now(UTC)
        offset, number = start.offset, start.line
        for raw in iter(stream.readline, b""):
            end = offset + len(raw)
            text = raw.strip()
            if text:
                mapped = self._parse(text, number, now)
                bodies = [one for one in mapped if not isinstance(one, Skipped)]
                skipped = len(mapped) - len(bodies)
                first = start.done if offset == start.offset else 0
                if first:  # the line's skips were counted with its first items, before the stop
                    skipped = 0
                for index in range(first, len(bodies)):
                    last = index == len(bodies) - 1
                    after = (
                        Position(end, number + 1) if last else Position(offset, number, index + 1)
                    )
                    yield Item(self._target(bodies[index]), number, after, skipped)
                    skipped = 0
                if not bodies:
                    yield Passed(Position(end, number + 1), skipped)
            else:
                yield Passed(Position(end, number + 1), 0)
            offset, number = end, number + 1

    def _parse(self, text: bytes, number: int, now: datetime) -> list[Body | Skipped]:
        try:
            return list(records(_json_object(text), self.fmt, now))
        except RecursionError:
            raise self._bad_line(number, "nested too deeply") from None
        except (ValueError, BadRecord) as exc:  # json.JSONDecodeError is a ValueError
            raise self._bad_line(number, str(exc)) from None

    def _bad_line(self, number: int, why: str) -> TransferFailed:
        return TransferFailed(
            f"{self.source}:{number}: not a {self.fmt} record: {why}. Nothing of this line "
            "or later was imported; fix it and run the command again (it resumes here)."
        )

    def _target(self, body: Body) -> Body:
        # Records of one subject under many keys are distinct facts: past the write gate.
        body = {**body, "new_key": True}
        if self.space_id is not None:
            body["space_id"] = self.space_id
        return body

    def _send(self, batch: list[Item], before: Position, size: int) -> Position:
        while True:
            key = _batch_key(self.run_id, before, [item.body for item in batch])
            self._checkpoint(before, size, in_flight=key, until=batch[-1].after)
            answer = self.server.call(
                "POST",
                BATCH_PATH,
                json={"items": [item.body for item in batch]},
                headers={"Idempotency-Key": key},
            )
            if answer.status_code == 201:
                count = int(answer.json()["count"])
                self.imported += count
                if answer.headers.get("idempotent-replayed") == "true":
                    self.replayed += count
                self.skipped += sum(item.skipped for item in batch)
                after = batch[-1].after
                self._checkpoint(after, size, in_flight=None)
                return after
            largest = _largest_batch(answer, len(batch))
            if largest is not None:  # the server (or the tenant's quota) takes fewer at once
                self.batch_size = largest
                position = before
                for start in range(0, len(batch), largest):
                    position = self._send(batch[start : start + largest], position, size)
                return position
            try:
                batch = self._refused(answer, batch)
            except _AllRejected as gone:
                self._checkpoint(gone.after, size, in_flight=None)
                return gone.after

    def _refused(self, answer: Any, batch: list[Item]) -> list[Item]:
        """What is left to send after a refusal (--skip-invalid), or stop."""
        body = answer.json() if answer.headers.get("content-type", "").endswith("json") else {}
        errors = body.get("errors", []) if isinstance(body, dict) else []
        if answer.status_code != 422 or not str(body.get("type", "")).endswith("batch-rejected"):
            raise TransferFailed(
                f"{self.server.url}{BATCH_PATH} answered {answer.status_code}: "
                f"{problem_detail(answer)}"
            )
        failing = {int(error["index"]) for error in errors}
        lines = "; ".join(f"line {batch[int(e['index'])].line}: {e['detail']}" for e in errors[:10])
        if not self.skip_invalid:
            raise TransferFailed(
                f"a batch was refused, nothing of it was written: {lines}. Fix those lines "
                "(or pass --skip-invalid) and run the command again; it resumes at that batch."
            )
        print(f"memgate import: skipped {len(failing)} invalid: {lines}", file=self.progress_stream)
        self.rejected += len(failing)
        kept = [item for index, item in enumerate(batch) if index not in failing]
        carried = sum(item.skipped for index, item in enumerate(batch) if index in failing)
        if kept:
            kept[0].skipped += carried
        else:  # nothing left: the position still moves past them
            self.skipped += carried
            raise _AllRejected(batch[-1].after)
        return kept

    def _checkpoint(
        self,
        position: Position,
        size: int,
        *,
        in_flight: str | None,
        until: Position | None = None,
    ) -> None:
        _save(
            self.state_file,
            {
                "run": self.run_id,
                "input": str(self.source),
                "size": size,
                "format": self.fmt,
                "position": position.__dict__,
                "in_flight": in_flight,
                "in_flight_until": None if until is None else until.__dict__,
                "batch_size": self.batch_size,
                "imported": self.imported,
                "replayed": self.replayed,
                "skipped": self.skipped,
                "rejected": self.rejected,
            },
        )


def _json_object(text: bytes) -> dict[str, Any]:
    line = json.loads(text)
    if not isinstance(line, dict):
        raise BadRecord("expected a JSON object")
    return line


class _AllRejected(Exception):
    def __init__(self, after: Position) -> None:
        self.after = after


def _beyond(position: Position, end: Position) -> bool:
    return (position.offset, position.done) > (end.offset, end.done)


def _largest_batch(answer: Any, sent: int) -> int | None:
    """The `max_items` of a 422 that refused the batch for its size alone (more items than
    MEMGATE_BATCH_MAX_ITEMS, or than the tenant's embedding quota admits at once)."""
    if answer.status_code != 422 or not answer.headers.get("content-type", "").endswith("json"):
        return None
    body = answer.json()
    largest = body.get("max_items") if isinstance(body, dict) else None
    if isinstance(largest, int) and not isinstance(largest, bool) and 1 <= largest < sent:
        return largest
    return None


def _batch_key(run_id: str, start: Position, bodies: list[Body]) -> str:
    """Within one run, the same batch from the same place has the same key (a re-run after a
    kill resumes the run: it sends the batch that was in flight again, and gets its stored
    answer if it had committed). Another run of the same file has another `run_id`."""
    digest = hashlib.sha256(f"{start.offset}:{start.done}:".encode())
    digest.update(json.dumps(bodies, sort_keys=True, separators=(",", ":")).encode())
    return f"import-{run_id}-{digest.hexdigest()[:48]}"


# -- export ----------------------------------------------------------------------------------


def export_record(memory: dict[str, Any]) -> dict[str, Any]:
    """A listed memory as a line of the memgate import format: the write body, its expiry, and
    its origin in `metadata["memgate.provenance"]` (replaced if it came from an earlier
    export: the line tells where this copy came from)."""
    provenance = memory["provenance"]
    metadata = {name: value for name, value in memory["metadata"].items() if name != PROVENANCE}
    metadata[PROVENANCE] = {
        "id": memory["id"],
        "space_id": memory["space_id"],
        "version": memory["version"],
        "writer_id": provenance["writer_id"],
        "client_id": provenance["client_id"],
        "created_at": provenance["recorded_at"],
        "derived_from": provenance["derived_from"],
    }
    line: dict[str, Any] = {
        "subject": memory["subject"],
        "kind": memory["kind"],
        "key": memory["key"],
        "value": memory["value"],
        "metadata": metadata,
        "valid_from": memory["valid_from"],
    }
    if provenance.get("source") is not None:
        line["source"] = provenance["source"]
    if memory.get("expires_at") is not None:
        line["expires_at"] = memory["expires_at"]
    return line


@dataclass
class ExportRun:
    server: Server
    target: Path
    state_file: Path
    space_id: str | None = None
    progress_stream: IO[str] = field(default_factory=lambda: sys.stderr)

    def run(self) -> dict[str, Any]:
        state = _load(self.state_file)
        began = time.monotonic()
        if state is None:
            cursor, written, length = None, 0, 0
            _create_private(self.target)
        else:
            cursor, written, length = state["cursor"], int(state["written"]), int(state["bytes"])
        out = self.target.open("r+b")
        out.truncate(length)  # a page written after the last checkpoint is written again
        out.seek(length)
        progress = Progress("export", None, self.progress_stream)
        progress.counted_at_start = written
        with out:
            while True:
                params = {"limit": str(PAGE_SIZE)}
                if cursor is not None:
                    params["cursor"] = cursor
                if self.space_id is not None:
                    params["space_id"] = self.space_id
                answer = self.server.call("GET", "/v1/memories", params=params)
                if answer.status_code != 200:
                    raise TransferFailed(
                        f"{self.server.url}/v1/memories answered {answer.status_code}: "
                        f"{problem_detail(answer)}"
                    )
                page = answer.json()
                for memory in page["items"]:
                    out.write(json.dumps(export_record(memory), ensure_ascii=False).encode())
                    out.write(b"\n")
                written += len(page["items"])
                out.flush()
                os.fsync(out.fileno())
                cursor = page["next_cursor"]
                if cursor is None:
                    break
                _save(self.state_file, {"cursor": cursor, "written": written, "bytes": out.tell()})
                progress.show(written, 0, None)
        progress.show(written, 0, None)
        self.state_file.unlink(missing_ok=True)
        return {"exported": written, "seconds": round(time.monotonic() - began, 3)}
