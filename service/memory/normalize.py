"""The one normalization of memory text: what "the same claim" means for revocation (promise 7).

`normalized(text)`: NFKC, case fold (`str.casefold`), every default-ignorable code point
removed, white space collapsed to one space, stripped. Symbols stay (`>` `<` `%` `#`, a leading
minus): "> 10000" and "< 10000" are opposite claims, "-5" and "5" different numbers.
`content_hash(text)` is its SHA-256: what a revocation looks a re-written claim up by.
`quotes(reason, value)`: does `reason` repeat a run of `QUOTE_RUN` consecutive tokens of
`value` (a revocation reason may not carry the content it takes down). docs/revocation.md has
the table of cases (tests/unit/memory/test_normalize.py holds it).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    # Unicode DerivedCoreProperties.txt, Default_Ignorable_Code_Point (Unicode 15.1/16.0),
    # as inclusive ranges. Not only category Cf: variation selectors (Mn), the combining
    # grapheme joiner (Mn), Hangul fillers (Lo), Mongolian selectors (Mn) and unassigned
    # reserved code points are invisible too, and each would make a "different" text.
    (0x00AD, 0x00AD),  # SOFT HYPHEN
    (0x034F, 0x034F),  # COMBINING GRAPHEME JOINER
    (0x061C, 0x061C),  # ARABIC LETTER MARK
    (0x115F, 0x1160),  # HANGUL CHOSEONG FILLER, HANGUL JUNGSEONG FILLER
    (0x17B4, 0x17B5),  # KHMER VOWEL INHERENT AQ, AA
    (0x180B, 0x180F),  # MONGOLIAN FREE VARIATION SELECTORS, VOWEL SEPARATOR
    (0x200B, 0x200F),  # ZERO WIDTH SPACE, ZWNJ, ZWJ, LRM, RLM
    (0x202A, 0x202E),  # bidirectional embeddings and overrides
    (0x2060, 0x206F),  # WORD JOINER, invisible operators, bidi isolates, reserved
    (0x3164, 0x3164),  # HANGUL FILLER
    (0xFE00, 0xFE0F),  # VARIATION SELECTOR-1..16
    (0xFEFF, 0xFEFF),  # ZERO WIDTH NO-BREAK SPACE (BOM)
    (0xFFA0, 0xFFA0),  # HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFF8),  # reserved
    (0x1BCA0, 0x1BCA3),  # SHORTHAND FORMAT CONTROLS
    (0x1D173, 0x1D17A),  # MUSICAL SYMBOL BEGIN/END BEAM, TIE, SLUR, PHRASE
    (0xE0000, 0xE0FFF),  # TAGS, VARIATION SELECTOR-17..256, reserved
)

_IGNORABLE = re.compile(
    "["
    + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in DEFAULT_IGNORABLE)
    + "]"
)
_TOKEN = re.compile(r"\w+")
QUOTE_RUN = 3
"""Consecutive tokens of a memory's value that a revocation reason may not repeat."""


def is_default_ignorable(code_point: int) -> bool:
    return any(lo <= code_point <= hi for lo, hi in DEFAULT_IGNORABLE)


def normalized(text: str) -> str:
    """NFKC, case fold, default-ignorables out, white space collapsed, stripped. NFKC runs again
    after the fold and the removal: both can leave a sequence that composes further."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    visible = _IGNORABLE.sub("", folded)
    return " ".join(unicodedata.normalize("NFKC", visible).split())


def content_hash(text: str) -> bytes:
    """SHA-256 of `normalized(text)`: equal for the same claim however it is spelled."""
    return hashlib.sha256(normalized(text).encode()).digest()


def tokens(text: str) -> list[str]:
    """The word tokens of `normalized(text)` (runs of letters, digits and underscores)."""
    return _TOKEN.findall(normalized(text))


def quotes(reason: str, value: str, run: int = QUOTE_RUN) -> bool:
    """Does `reason` hold `run` consecutive tokens of `value`, in order (normalized)?"""
    source = tokens(value)
    if len(source) < run:
        return False
    quoted = {tuple(source[i : i + run]) for i in range(len(source) - run + 1)}
    said = tokens(reason)
    return any(tuple(said[i : i + run]) in quoted for i in range(len(said) - run + 1))
