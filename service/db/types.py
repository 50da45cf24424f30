"""Constraints that come from what PostgreSQL can store."""

from __future__ import annotations

NO_NUL = r"^[^\x00]*$(?!\n)"
"""PostgreSQL text and jsonb cannot hold NUL (U+0000); schemas refuse it up front so it is a 422
problem, not a driver error."""
