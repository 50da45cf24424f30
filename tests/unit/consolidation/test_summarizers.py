"""The extractive summarizer is deterministic, de-duplicates and caps; untrusted text is made
storable (no NUL or control characters) and capped."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from service.consolidation.problems import SummarizerFailed
from service.consolidation.repository import InputRow
from service.consolidation.service import fingerprint
from service.consolidation.summarizers import (
    ChatSummarizer,
    Extractive,
    Input,
    capped,
    create_summarizer,
)
from service.memory.normalize import content_hash
from service.settings import SummarizerSettings

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _input(key: str, value: str, minutes: int = 0) -> Input:
    return Input(key, "fact", value, T0 + timedelta(minutes=minutes), content_hash(value))


async def test_extractive_is_newest_first_deduplicated_and_deterministic() -> None:
    inputs = [
        _input("window", "Deploys run on Thursdays", 3),
        _input("window.copy", "deploys  run on THURSDAYS", 2),  # the same text, normalized
        _input("owner", "The search team owns the index", 1),
    ]
    summarizer = Extractive(4000)
    first = await summarizer.summarize("service:search", inputs)
    assert first == "window: Deploys run on Thursdays\nowner: The search team owns the index"
    assert await summarizer.summarize("service:search", inputs) == first


async def test_extractive_caps_with_a_note_of_what_was_left_out() -> None:
    inputs = [_input(f"k{n}", f"value number {n} " + "x" * 40) for n in range(50)]
    text = await Extractive(300).summarize("s", inputs)
    assert len(text) <= 300
    assert text.endswith("more)")
    assert text.startswith("k0: value number 0")
    long = await Extractive(4000).summarize("s", [_input("k", "y" * 5000)])
    assert len(long) < 600  # one value is quoted up to 500 characters


def test_untrusted_text_is_stored_as_plain_capped_text() -> None:
    assert capped("  hello\x00 world\x1b[2J\n\tnext  ", 100) == "hello world[2J\n\tnext"
    assert capped("a" * 50, 10) == "a" * 9 + "…"
    assert capped("\x00\x01 ", 10) == ""


def test_settings_refuse_a_model_without_an_endpoint() -> None:
    with pytest.raises(ValueError, match="MEMGATE_SUMMARIZER_KIND"):
        SummarizerSettings(kind="gpt")
    with pytest.raises(ValueError, match="MEMGATE_SUMMARIZER_URL"):
        SummarizerSettings(kind="openai")
    chosen = create_summarizer(SummarizerSettings(max_chars=9000), max_value_chars=2000)
    assert chosen.id == "extractive/v1@2000"  # never longer than a memory may be


def test_the_fingerprint_names_exactly_the_versions_and_the_summarizer() -> None:
    def row(i: int, version: int = 1, value: str = "v") -> InputRow:
        return InputRow(
            uuid.UUID(int=i),
            uuid.UUID(int=99),
            (),
            "k",
            "fact",
            value,
            version,
            content_hash(value),
            None,
            T0,
            None,
        )

    base = fingerprint("extractive/v1@4000", [row(1), row(2)])
    assert fingerprint("extractive/v1@4000", [row(2), row(1)]) == base  # order is no change
    assert fingerprint("extractive/v1@4000", [row(1), row(2, version=2)]) != base
    assert fingerprint("extractive/v1@4000", [row(1), row(2, value="w")]) != base
    assert fingerprint("extractive/v1@4000", [row(1)]) != base
    assert fingerprint("openai/m@4000", [row(1), row(2)]) != base


async def _endless(chunk: bytes, pause: float) -> AsyncIterator[bytes]:
    while True:
        await asyncio.sleep(pause)
        yield chunk


def _chat(transport: httpx.MockTransport, timeout: float = 5.0) -> ChatSummarizer:
    settings = SummarizerSettings(
        kind="openai", url="http://chat.local", model="m", timeout_seconds=timeout, retries=1
    )
    return ChatSummarizer(settings, transport=transport)


async def test_a_huge_chat_answer_is_refused_before_it_is_held_whole() -> None:
    """Issue 18, unsafe consumption: an endless answer is dropped past a megabyte."""
    endless = httpx.MockTransport(lambda _: httpx.Response(200, content=_endless(b"x" * 65536, 0)))
    async with asyncio.timeout(10), _chat(endless) as chat:
        with pytest.raises(SummarizerFailed):
            await chat.summarize("service:x", [_input("k", "v")])


async def test_a_trickling_summarizer_is_cut_off_at_the_attempts_time() -> None:
    trickle = httpx.MockTransport(lambda _: httpx.Response(200, content=_endless(b" ", 0.05)))
    began = time.monotonic()
    async with asyncio.timeout(10), _chat(trickle, timeout=0.3) as chat:
        with pytest.raises(SummarizerFailed, match="unreachable or keeps failing"):
            await chat.summarize("service:x", [_input("k", "v")])
    assert time.monotonic() - began < 2.0
