"""The one normalization (service/memory/normalize.py), as a table: each input, its normalized
form, and whether it is the same claim as the first column's reference. docs/revocation.md
shows the same table."""

from __future__ import annotations

import unicodedata

import pytest

from service.memory.normalize import (
    DEFAULT_IGNORABLE,
    content_hash,
    is_default_ignorable,
    normalized,
    quotes,
)

CASES = [
    # (input, normalized, reference, same claim as the reference?)
    ("Deploy  window is\nFRIDAY", "deploy window is friday", "deploy window is friday", True),
    ("\u00a0 tabs\tand\u2003em spaces \u3000", "tabs and em spaces", "tabs and em spaces", True),
    ("Straße", "strasse", "STRASSE", True),
    ("ﬁle", "file", "file", True),
    ("\uff21\uff22\uff23 full width", "abc full width", "abc full width", True),
    ("zero\u200bwidth space", "zerowidth space", "zerowidth space", True),
    ("joi\u200dner and non\u200cjoiner", "joiner and nonjoiner", "joiner and nonjoiner", True),
    ("variation\ufe0f selector", "variation selector", "variation selector", True),
    ("supplementary\U000e0100 selector", "supplementary selector", "supplementary selector", True),
    (
        "combining\u034f grapheme joiner",
        "combining grapheme joiner",
        "combining grapheme joiner",
        True,
    ),
    ("hangul\u3164filler", "hangulfiller", "hangulfiller", True),
    ("halfwidth\uffa0filler", "halfwidthfiller", "halfwidthfiller", True),
    ("choseong\u115ffiller", "choseongfiller", "choseongfiller", True),
    ("soft\u00adhyphen", "softhyphen", "softhyphen", True),
    ("mongolian\u180bselector", "mongolianselector", "mongolianselector", True),
    ("tag\U000e0041\U000e007fs", "tags", "tags", True),
    ("word\u2060joiner", "wordjoiner", "wordjoiner", True),
    ("bidi\u202eoverride", "bidioverride", "bidioverride", True),
    ("byte order\ufeff mark", "byte order mark", "byte order mark", True),
    (
        "interlinear\ufff9 anno\ufffatation\ufffb",
        "interlinear annotation",
        "interlinear annotation",
        True,
    ),
    ("egyp\U00013430tian format", "egyptian format", "egyptian format", True),
    ("null\U0001d159notehead", "nullnotehead", "nullnotehead", True),
    ("braille\u2800blank", "braille blank", "braille blank", True),
    ("Deploy on Friday.", "deploy on friday", "deploy on friday", True),
    ("\u201cdeploy on friday\u201d \u2026", "deploy on friday", "deploy on friday", True),
    ("(deploy on friday);", "deploy on friday", "deploy on friday", True),
    ("3.14 is pi", "3.14 is pi", "314 is pi", False),
    ("> 10000", "> 10000", "< 10000", False),
    ("limit: > 10000.", "limit: > 10000", "limit: < 10000", False),
    ("-5 degrees", "-5 degrees", "5 degrees", False),
    ("the change is -5", "the change is -5", "the change is 5", False),
    ("+5 degrees", "+5 degrees", "5 degrees", False),
    ("deploy on friday?", "deploy on friday?", "deploy on friday", False),
    ("deploy on friday!", "deploy on friday!", "deploy on friday", False),
    ("discount 50%.", "discount 50%", "discount 50", False),
    ("50% off", "50% off", "50 off", False),
    ("#1 priority", "#1 priority", "1 priority", False),
    ("deploy on friday", "deploy on friday", "deploy on monday", False),
]


@pytest.mark.parametrize(("text", "expected", "reference", "same"), CASES)
def test_normalization_table(text: str, expected: str, reference: str, same: bool) -> None:
    assert normalized(text) == expected
    assert (content_hash(text) == content_hash(reference)) is same


def test_every_default_ignorable_range_is_removed() -> None:
    for lo, hi in DEFAULT_IGNORABLE:
        for code_point in (lo, hi, (lo + hi) // 2):
            assert normalized(f"a{chr(code_point)}b") == "ab", hex(code_point)
    # Not only category Cf: variation selectors and CGJ are Mn, Hangul fillers Lo.
    categories = {unicodedata.category(chr(c)) for c in (0xFE00, 0x034F, 0x3164, 0x115F)}
    assert categories == {"Mn", "Lo"}
    assert is_default_ignorable(0xE0FFF)
    assert not is_default_ignorable(ord(">"))
    assert not is_default_ignorable(ord("a"))


def test_a_reason_quotes_three_consecutive_tokens() -> None:
    value = "Purchases above 5000 EUR need one manager approval"
    assert quotes("the 5000 eur need rule is gone", value)
    assert quotes("PURCHASES\u200d ABOVE 5000", value)
    assert not quotes("above 5000: replaced by the new policy", value)
    assert not quotes("approval need manager", value)  # not in order
    assert not quotes("anything at all", "two words")


def test_underscores_split_tokens() -> None:
    value = "Refunds above 200 EUR need a second signature"
    assert quotes("old rule: refunds_above_200_EUR_need_a_second_signature", value)
    assert not quotes("snake_case words", value)


def test_a_short_value_quoted_whole_is_quoted() -> None:
    assert quotes("it said two words, now gone", "Two words.")
    assert quotes("it said yes", "YES")
    assert not quotes("it said two, now gone", "two words")
    assert not quotes("words two", "two words")  # not in order
    assert not quotes("anything", "...")  # no tokens: nothing to quote


def test_punctuation_kept_at_the_ends() -> None:
    for symbol in "-+=!?%#<>":
        assert normalized(f"{symbol}x{symbol}") == f"{symbol}x{symbol}", symbol
    assert normalized(" . , ; : \"'()[]{} ") == ""
