"""Per-tenant settings: what a platform admin tunes for one tenant (docs/tenants.md, Settings).

A tenant can tighten the operator's limits (service/settings.py `MemorySettings`), never exceed
them: each limit is range-checked against the operator's value when it is set, and the
effective limit of a call is the smaller of the two (`effective_limits`), so an operator who
lowers a global limit later lowers every tenant's with it.

The settings are read in the call's entrance statement (service/auth/resolver.py) and travel
with the caller (`Principal.tenant_settings`): no extra round trip per request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgspec

from service.settings import TEXT_SEARCH_CONFIGS, MemorySettings

if TYPE_CHECKING:
    from service.calls import Call
    from service.runtime import Runtime

MAX_TTL_SECONDS = 315_360_000
"""Ten years, the largest `ttl_seconds` a write may give (service/memory/schemas.py)."""
MAX_RETENTION_DAYS = 36_500


class TenantSettings(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, frozen=True):
    """One tenant's settings; a field left out (None) takes the operator's value."""

    search_exact_max_rows: int | None = None
    """Up to this many visible rows a search ranks exactly (0..MEMGATE_SEARCH_EXACT_MAX_ROWS)."""
    ann_ef_search: int | None = None
    """The HNSW candidate list of an approximate search (1..MEMGATE_SEARCH_ANN_EF)."""
    max_k: int | None = None
    """The largest `k` a search may ask for (1..MEMGATE_MAX_K)."""
    max_page_size: int | None = None
    """The largest `limit` of a list page (1..MEMGATE_MAX_PAGE_SIZE)."""
    score_floor: float | None = None
    """The cosine floor of a search that names no `min_score` (0..1; 0: no floor). Unset: the
    operator's MEMGATE_SEARCH_SCORE_FLOOR (docs/recall.md, "Hybrid recall")."""
    text_search_config: str | None = None
    """The PostgreSQL text search configuration of the tenant's lexical leg ("simple",
    "english", "german", ...: `TEXT_SEARCH_CONFIGS`), used for what is written from now on and
    for every query. Rows written before a change keep their lexemes (docs/recall.md)."""
    default_ttl_seconds: int | None = None
    """The TTL of a write that gives none (1..315360000 s)."""
    retention_days: int | None = None
    """How long `memory.sweep_expired` keeps a memory past its `expires_at` before deleting it
    (1..36500 days; unset: the operator's `MEMGATE_RETENTION_DAYS`)."""
    agents_may_read_policy: bool = True
    """Whether an agent's client may hold `read:policy` (default: yes, as before settings)."""
    crypto_shredding: bool = False
    """Store the text of memories written from now on sealed under a data key per owner, kept
    outside the database; erasing the owner destroys the key, which makes that text unreadable
    in WAL, replicas and backups too (docs/erasure.md, "Crypto-shredding"). Rows written before
    stay as they were stored (plaintext until rewritten); turning it off later leaves sealed
    rows sealed (they still read and still shred)."""


DEFAULT = TenantSettings()


@dataclass(frozen=True)
class Range:
    low: float
    high: float


class SettingsInvalid(ValueError):
    """A setting out of its range, of the wrong type, or unknown: `field` and `allowed` say
    which and what would be accepted."""

    def __init__(self, field: str, allowed: str, detail: str) -> None:
        super().__init__(detail)
        self.field, self.allowed = field, allowed


def ranges(limits: MemorySettings) -> dict[str, Range]:
    """Each numeric setting's allowed range under the operator's `limits`."""
    return {
        "search_exact_max_rows": Range(0, limits.exact_search_max_rows),
        "ann_ef_search": Range(1, limits.ann_ef_search),
        "max_k": Range(1, limits.max_k),
        "max_page_size": Range(1, limits.max_page_size),
        "score_floor": Range(0, 1),
        "default_ttl_seconds": Range(1, MAX_TTL_SECONDS),
        "retention_days": Range(1, MAX_RETENTION_DAYS),
    }


FIELDS = tuple(TenantSettings.__struct_fields__)


def stored(raw: object) -> TenantSettings:
    """The settings as stored (validated when written); anything unreadable counts as none,
    so a bad row can never widen a limit (every default is the operator's)."""
    try:
        return msgspec.convert(raw or {}, TenantSettings)
    except msgspec.ValidationError:
        return DEFAULT


def merged(
    current: dict[str, Any], change: dict[str, Any], limits: MemorySettings
) -> dict[str, Any]:
    """`change` merged key by key into `current` (a null value resets that key to the
    operator's default) and validated: the settings to store. Raises `SettingsInvalid`."""
    for key in change:
        if key not in FIELDS:
            raise SettingsInvalid(
                f"settings.{key}", ", ".join(FIELDS), f"'settings.{key}' is not a setting."
            )
    result = {k: v for k, v in ({**current, **change}).items() if v is not None and k in FIELDS}
    checked = _typed(result)
    bounds = ranges(limits)
    for key, bound in bounds.items():
        value = getattr(checked, key)
        if value is not None and not bound.low <= value <= bound.high:
            allowed = f"{_num(bound.low)}..{_num(bound.high)}"
            raise SettingsInvalid(
                f"settings.{key}",
                allowed,
                f"'settings.{key}' must be between {allowed}; got {value}.",
            )
    config = checked.text_search_config
    if config is not None and config not in TEXT_SEARCH_CONFIGS:
        allowed = ", ".join(TEXT_SEARCH_CONFIGS)
        raise SettingsInvalid(
            "settings.text_search_config",
            allowed,
            f"'settings.text_search_config' must be one of {allowed}; got {config!r}.",
        )
    out: dict[str, Any] = msgspec.to_builtins(checked)
    return out


def _typed(raw: dict[str, Any]) -> TenantSettings:
    try:
        return msgspec.convert(raw, TenantSettings)
    except msgspec.ValidationError as exc:
        # msgspec names the path as `$.field`: say it as the API does.
        message = str(exc)
        where = message.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in message else "settings"
        key = where.split(".")[0].split("[")[0]
        field = f"settings.{key}" if key in FIELDS else "settings"
        raise SettingsInvalid(field, _kind(key), f"'{field}': {message}") from None


def _kind(key: str) -> str:
    if key in ("agents_may_read_policy", "crypto_shredding"):
        return "true or false"
    if key == "score_floor":
        return "a number 0..1"
    if key == "text_search_config":
        return "one of " + ", ".join(TEXT_SEARCH_CONFIGS)
    return "an integer"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def effective_limits(limits: MemorySettings, tenant: TenantSettings) -> MemorySettings:
    """The operator's memory limits, tightened by the tenant's settings (never widened)."""
    return replace(
        limits,
        exact_search_max_rows=_tighter(limits.exact_search_max_rows, tenant.search_exact_max_rows),
        ann_ef_search=_tighter(limits.ann_ef_search, tenant.ann_ef_search),
        max_k=_tighter(limits.max_k, tenant.max_k),
        default_k=min(limits.default_k, _tighter(limits.max_k, tenant.max_k)),
        max_page_size=_tighter(limits.max_page_size, tenant.max_page_size),
        default_ttl_seconds=tenant.default_ttl_seconds or limits.default_ttl_seconds,
        # Not limits but defaults: a tenant may set any floor and any shipped language.
        score_floor=limits.score_floor if tenant.score_floor is None else tenant.score_floor,
        text_search_config=tenant.text_search_config or limits.text_search_config,
    )


def _tighter(operator: int, tenant: int | None) -> int:
    return operator if tenant is None else min(operator, tenant)


def tenant_limits(runtime: Runtime, call: Call) -> MemorySettings:
    """The memory limits of `call`: the operator's, tightened by its caller's tenant."""
    caller = call.caller
    settings = DEFAULT if caller is None else caller.tenant_settings
    return effective_limits(runtime.settings.memory, settings)
