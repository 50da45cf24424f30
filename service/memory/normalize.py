"""The one normalization of memory text: what "the same claim" means for revocation (promise 7).

`normalized(text)`: NFKC, case fold (`str.casefold`), every default-ignorable code point and
every other format control (category Cf) or blank-rendering symbol removed, the braille blank
read as a space, white space collapsed to one space, punctuation trimmed from both ends except
the symbols that carry meaning. Symbols stay (`>` `<` `%` `#` `+` `=` `!` `?`, a leading
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

INVISIBLE_OTHER: tuple[tuple[int, int], ...] = (
    # Format controls (category Cf, Unicode 16.0) that are not Default_Ignorable, and symbols
    # that render as nothing: each spells a text that looks the same and would hash apart.
    # Listed, not asked of `unicodedata` per call, so the hash does not move with Python's
    # Unicode version.
    (0x0600, 0x0605),  # ARABIC NUMBER SIGN .. ARABIC NUMBER MARK ABOVE (prepended marks)
    (0x06DD, 0x06DD),  # ARABIC END OF AYAH
    (0x070F, 0x070F),  # SYRIAC ABBREVIATION MARK
    (0x0890, 0x0891),  # ARABIC POUND/PIASTRE MARK ABOVE
    (0x08E2, 0x08E2),  # ARABIC DISPUTED END OF AYAH
    (0xFFF9, 0xFFFB),  # INTERLINEAR ANNOTATION ANCHOR, SEPARATOR, TERMINATOR
    (0x110BD, 0x110BD),  # KAITHI NUMBER SIGN
    (0x110CD, 0x110CD),  # KAITHI NUMBER SIGN ABOVE
    (0x13430, 0x1343F),  # EGYPTIAN HIEROGLYPH format controls (joiners, insertions, ...)
    (0x1D159, 0x1D159),  # MUSICAL SYMBOL NULL NOTEHEAD (So, renders as nothing)
)
BLANKS = "\u2800"
"""Read as a space: BRAILLE PATTERN BLANK renders as one but is a symbol (So), not white space."""
KEPT_AT_ENDS = frozenset("-+=!?%#<>")
"""Punctuation that carries meaning at a text's ends (a sign, a question, a percentage); other
punctuation (a final `.`, quotes, brackets, `:` `;` `,` `…`) is trimmed from both ends."""


def _ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in ranges)


_IGNORABLE = re.compile("[" + _ranges(DEFAULT_IGNORABLE) + _ranges(INVISIBLE_OTHER) + "]")
_BLANK = re.compile("[" + BLANKS + "]")
_TOKEN = re.compile(r"[^\W_]+")
QUOTE_RUN = 3
"""Consecutive tokens of a memory's value that a revocation reason may not repeat."""


def is_default_ignorable(code_point: int) -> bool:
    return any(lo <= code_point <= hi for lo, hi in DEFAULT_IGNORABLE)


def normalized(text: str) -> str:
    """NFKC, case fold, invisibles out, blanks as spaces, white space collapsed, ends trimmed.
    NFKC runs again after the fold and the removal: both can leave a sequence that composes
    further."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    visible = _BLANK.sub(" ", _IGNORABLE.sub("", folded))
    return _trimmed(" ".join(unicodedata.normalize("NFKC", visible).split()))


def _trimmed(text: str) -> str:
    """`text` without punctuation (category P*) or spaces at either end, but for the symbols
    in KEPT_AT_ENDS: "Deploy on Friday." is the claim "deploy on friday"; "-5" stays "-5"."""
    start, end = 0, len(text)
    while start < end and _trimmable(text[start]):
        start += 1
    while end > start and _trimmable(text[end - 1]):
        end -= 1
    return text[start:end]


def _trimmable(char: str) -> bool:
    if char == " ":
        return True
    return char not in KEPT_AT_ENDS and unicodedata.category(char).startswith("P")


def content_hash(text: str) -> bytes:
    """SHA-256 of `normalized(text)`: equal for the same claim however it is spelled."""
    return hashlib.sha256(normalized(text).encode()).digest()


def tokens(text: str) -> list[str]:
    """The word tokens of `normalized(text)`: runs of letters and digits. `_` separates tokens,
    so a reason cannot join the content's words with underscores and pass the quote check."""
    return _TOKEN.findall(normalized(text))


def quotes(reason: str, value: str, run: int = QUOTE_RUN) -> bool:
    """Does `reason` hold `run` consecutive tokens of `value`, in order (normalized)? A value
    of fewer than `run` tokens is quoted when the reason holds all of them, in order."""
    source = tokens(value)
    if not source:
        return False
    run = min(run, len(source))
    quoted = {tuple(source[i : i + run]) for i in range(len(source) - run + 1)}
    said = tokens(reason)
    return any(tuple(said[i : i + run]) in quoted for i in range(len(said) - run + 1))
