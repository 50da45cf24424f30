"""Constraints that come from what PostgreSQL can store."""

from __future__ import annotations

NO_NUL = r"^[^\x00]*$(?!\n)"
"""PostgreSQL text and jsonb cannot hold NUL (U+0000); schemas refuse it up front so it is a 422
problem, not a driver error."""

NOT_BLANK = r"^(?=[\s\S]*\S)[^\x00]*$(?!\n)"
"""Text that is the content of a call (a memory's value, a search query): at least one
character that is not white space, and no NUL."""

PATTERN_MEANINGS = {
    NO_NUL: "text without NUL (U+0000) characters",
    NOT_BLANK: "text with at least one non-space character and no NUL (U+0000) characters",
}
"""What these patterns mean, for problems: a model acts on words better than on a regex."""
