"""The JSONL shapes `memgate import` reads, each line mapped to bodies of `POST /v1/memories`.

- **memgate**: what `memgate export` writes: one memory per line, the single write's body plus
  `expires_at` (turned into `ttl_seconds` at import) and, in `metadata["memgate.provenance"]`,
  where it came from (id, space, writer, client, version, recorded and valid times, sources).
- **mem0**: a memory as mem0's `get_all` / `get` answers it (`id`, `memory`, `user_id`,
  `agent_id`, `app_id`, `run_id`, `hash`, `metadata`, `categories`, `created_at`,
  `updated_at`), or a page of them (`{"results": [...]}`).
- **zep**: a fact (an edge: `uuid`, `fact`, `name`, `valid_at`, `invalid_at`, `expired_at`,
  `source_node_uuid`, `target_node_uuid`, `episodes`), an episode or a message (`uuid`,
  `content`, `role`/`role_type`, `session_id`, `source`, `created_at`, `metadata`), or a page of
  them (`{"facts" | "edges" | "episodes" | "messages": [...]}`, its `user_id`/`session_id`
  applying to each), each line optionally naming its `user_id`.

The mappings are stated in docs/import-export.md. No function here talks to a server.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Format = Literal["memgate", "mem0", "zep"]
FORMATS: tuple[Format, ...] = ("memgate", "mem0", "zep")
PROVENANCE = "memgate.provenance"
"""The metadata member an export keeps a memory's origin in (replaced at each export)."""
RESERVED_SOURCE = "memgate:"
"""Sources memgate's own jobs write (a consolidation summary): the target's job re-derives
them, an import never writes them."""
_NOT_KEY = re.compile(r"[^A-Za-z0-9_.:/-]")
_NOT_SUBJECT = re.compile(r"[\s\x00-\x1f]")
LONGEST = 200
"""The longest key and subject memgate takes."""
HASHED = 12
"""Hex digits of the original id's SHA-256 an id that had to be changed or cut ends with."""

Body = dict[str, Any]


@dataclass(frozen=True)
class Skipped:
    """A record the import leaves out on purpose, and why (counted, never an error)."""

    reason: str


class BadRecord(ValueError):
    """A line that is not a record of its format (the import stops there, naming the line)."""


def records(line: dict[str, Any], fmt: Format, now: datetime) -> Iterator[Body | Skipped]:
    """The bodies one line of `fmt` becomes (a page line becomes several)."""
    if fmt == "memgate":
        yield from _memgate(line, now)
    elif fmt == "mem0":
        yield from _mem0(line)
    else:
        yield from _zep(line, {})


# -- memgate ---------------------------------------------------------------------------------

_WRITE_FIELDS = ("subject", "kind", "key", "value", "metadata", "source", "valid_from")


def _memgate(line: dict[str, Any], now: datetime) -> Iterator[Body | Skipped]:
    if not all(isinstance(line.get(name), str) for name in ("subject", "kind", "key", "value")):
        raise BadRecord("a memgate record needs string 'subject', 'kind', 'key' and 'value'")
    source = line.get("source")
    if isinstance(source, str) and source.startswith(RESERVED_SOURCE):
        yield Skipped("written by a memgate job (re-derived in the target)")
        return
    body: Body = {name: line[name] for name in _WRITE_FIELDS if line.get(name) is not None}
    if "ttl_seconds" in line and line["ttl_seconds"] is not None:
        body["ttl_seconds"] = line["ttl_seconds"]
    expires = line.get("expires_at")
    if isinstance(expires, str):
        left = math.ceil((_when(expires) - now).total_seconds())
        if left < 1:
            yield Skipped("expired")
            return
        body["ttl_seconds"] = left
    yield body


# -- mem0 ------------------------------------------------------------------------------------


def _mem0(line: dict[str, Any]) -> Iterator[Body | Skipped]:
    if isinstance(line.get("results"), list):  # a page of get_all
        for one in line["results"]:
            yield from _mem0(_object(one))
        return
    text, memory_id = line.get("memory"), line.get("id")
    if not isinstance(text, str) or not isinstance(memory_id, str):
        raise BadRecord("a mem0 memory needs string 'id' and 'memory'")
    if not text.strip():
        yield Skipped("empty memory")
        return
    origin = {
        name: line[name]
        for name in (
            "id",
            "hash",
            "user_id",
            "agent_id",
            "app_id",
            "run_id",
            "categories",
            "created_at",
            "updated_at",
        )
        if line.get(name) is not None
    }
    metadata = dict(_object(line.get("metadata") or {}))
    metadata["mem0"] = origin
    body: Body = {
        "subject": _subject(line, ("user_id", "agent_id", "app_id", "run_id"), "mem0"),
        "kind": "fact",
        "key": _key("mem0", memory_id),
        "value": text,
        "metadata": metadata,
        "source": "import:mem0",
    }
    created = line.get("created_at")
    if isinstance(created, str):
        body["valid_from"] = _when(created).isoformat()
    yield body


# -- zep -------------------------------------------------------------------------------------

_PAGES = ("facts", "edges", "episodes", "messages")


def _zep(line: dict[str, Any], inherited: dict[str, Any]) -> Iterator[Body | Skipped]:
    context = inherited | {
        name: line[name] for name in ("user_id", "session_id") if line.get(name) is not None
    }
    # A record has a uuid (a fact's own `episodes` lists ids, it is no page).
    pages = [name for name in _PAGES if isinstance(line.get(name), list)]
    if pages and "uuid" not in line:
        for name in pages:
            for one in line[name]:
                yield from _zep(_object(one), context)
        return
    item_id = line.get("uuid")
    if not isinstance(item_id, str):
        raise BadRecord("a Zep fact, episode or message needs a string 'uuid'")
    if isinstance(line.get("fact"), str):
        yield from _zep_fact(line, item_id, context)
    elif isinstance(line.get("content"), str):
        yield from _zep_episode(line, item_id, context)
    else:
        raise BadRecord("a Zep record needs 'fact' (a fact) or 'content' (an episode, a message)")


def _zep_fact(
    line: dict[str, Any], item_id: str, context: dict[str, Any]
) -> Iterator[Body | Skipped]:
    if line.get("invalid_at") or line.get("expired_at"):
        yield Skipped("a Zep fact no longer valid (invalid_at or expired_at set)")
        return
    merged = line | context
    origin = {
        name: merged[name]
        for name in (
            "uuid",
            "name",
            "source_node_uuid",
            "target_node_uuid",
            "episodes",
            "attributes",
            "created_at",
            "valid_at",
            "session_id",
            "user_id",
        )
        if merged.get(name) is not None
    }
    body: Body = {
        "subject": _subject(merged, ("user_id", "session_id"), "zep"),
        "kind": "fact",
        "key": _key("zep.fact", item_id),
        "value": line["fact"],
        "metadata": {"zep": origin},
        "source": "import:zep",
    }
    valid = line.get("valid_at") or line.get("created_at")
    if isinstance(valid, str):
        body["valid_from"] = _when(valid).isoformat()
    yield body


def _zep_episode(
    line: dict[str, Any], item_id: str, context: dict[str, Any]
) -> Iterator[Body | Skipped]:
    content = line["content"]
    if not content.strip():
        yield Skipped("empty Zep episode")
        return
    merged = line | context
    origin = {
        name: merged[name]
        for name in (
            "uuid",
            "role",
            "role_type",
            "session_id",
            "user_id",
            "source",
            "source_description",
            "created_at",
        )
        if merged.get(name) is not None
    }
    metadata = dict(_object(line.get("metadata") or {}))
    metadata["zep"] = origin
    who = line.get("role") or line.get("role_type")
    body: Body = {
        "subject": _subject(merged, ("user_id", "session_id"), "zep"),
        "kind": "episode",
        "key": _key("zep.episode", item_id),
        "value": f"{who}: {content}" if isinstance(who, str) and who else content,
        "metadata": metadata,
        "source": "import:zep",
    }
    created = line.get("created_at")
    if isinstance(created, str):
        body["valid_from"] = _when(created).isoformat()
    yield body


# -- shared ----------------------------------------------------------------------------------


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRecord("expected a JSON object")
    return value


def _subject(line: dict[str, Any], names: tuple[str, ...], fallback: str) -> str:
    """`user:<id>` from the first id the record names (`user_id` → `user:`, `agent_id` →
    `agent:` …), with whitespace and control characters replaced (a subject has none)."""
    for name in names:
        value = line.get(name)
        if isinstance(value, str | int) and str(value):
            kind = name.removesuffix("_id")
            return _fitted(f"{kind}:", str(value), _NOT_SUBJECT)
    return f"{fallback}:unknown"


def _key(prefix: str, item_id: str) -> str:
    """A key from the source's id: the same record imported twice supersedes itself instead of
    living twice."""
    return _fitted(f"{prefix}.", item_id, _NOT_KEY)


def _fitted(prefix: str, original: str, forbidden: re.Pattern[str]) -> str:
    """`prefix` + `original` as a key or subject may hold it: at most `LONGEST` characters,
    none `forbidden` (replaced by `_`). An id that had to be changed or cut ends with
    `.` and a hash of the original, so two ids that differ only where they were changed
    (`note 1` and `note_1`), or past the cut, stay two keys (two subjects); the same id
    always gives the same name. An id that fits is kept as it is."""
    cleaned = forbidden.sub("_", original)
    if cleaned == original and len(prefix) + len(original) <= LONGEST:
        return prefix + original
    digest = hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()[:HASHED]
    room = LONGEST - len(prefix) - 1 - HASHED
    return f"{prefix}{cleaned[:room]}.{digest}"


def _when(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRecord(f"not an ISO 8601 time: {text[:40]!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
