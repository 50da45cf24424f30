"""Declarative base with a naming convention so migrations get stable constraint names."""

from __future__ import annotations

import os
import threading
import time
import uuid

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class _Uuid7Clock:
    """RFC 9562 §6.2 method 1: within one millisecond a 12-bit counter (randomly seeded) makes ids
    strictly increasing, so "newest first" is exact even for writes in the same millisecond."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def next(self) -> uuid.UUID:
        with self._lock:
            unix_ms = time.time_ns() // 1_000_000
            if unix_ms > self._last_ms:
                self._last_ms, self._counter = unix_ms, int.from_bytes(os.urandom(2)) & 0x7FF
            else:  # same millisecond (or the clock stepped back): count on
                self._counter += 1
                if self._counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                    self._last_ms, self._counter = self._last_ms + 1, 0
            unix_ms, counter = self._last_ms, self._counter
        value = (unix_ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76  # version
        value |= counter << 64  # rand_a: the monotonic counter
        value |= 0b10 << 62  # variant
        value |= int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)  # rand_b
        return uuid.UUID(int=value)


_clock = _Uuid7Clock()


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 v7): ids sort by creation, which keeps btrees append-mostly
    and gives list pagination a stable order without a second column."""
    return _clock.next()
