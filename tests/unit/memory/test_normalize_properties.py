"""Properties of the one normalization (issue 18: hypothesis on normalization), over generated
text of every Unicode category: what revocation and the duplicate checks rely on."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.memory.normalize import content_hash, is_default_ignorable, normalized, quotes, tokens

TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
INVISIBLE = st.sampled_from(["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"])
RUNS = settings(
    max_examples=400, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)


@RUNS
@given(TEXT)
def test_normalizing_twice_is_normalizing_once(text: str) -> None:
    once = normalized(text)
    assert normalized(once) == once
    assert content_hash(once) == content_hash(text)


@RUNS
@given(TEXT)
def test_the_normal_form_has_no_invisibles_and_single_inner_spaces(text: str) -> None:
    once = normalized(text)
    assert not any(is_default_ignorable(ord(char)) for char in once)
    assert once == once.strip()
    assert "  " not in once
    assert all(not char.isspace() or char == " " for char in once)


@RUNS
@given(TEXT, INVISIBLE, st.integers(min_value=0, max_value=60))
def test_an_invisible_character_anywhere_changes_nothing(
    text: str, invisible: str, at: int
) -> None:
    at = min(at, len(text))
    assert normalized(text[:at] + invisible + text[at:]) == normalized(text)


@RUNS
@given(TEXT)
def test_case_and_surrounding_space_change_nothing(text: str) -> None:
    assert normalized(f"  {text.casefold()}\t\n") == normalized(text)


@RUNS
@given(TEXT)
def test_a_value_quotes_itself_when_it_has_words(text: str) -> None:
    assert quotes(text, text) == bool(tokens(text))
