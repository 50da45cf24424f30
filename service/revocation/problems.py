"""Problems of revoke and reinstate."""

from __future__ import annotations

from service.problems import Problem


class ReasonQuotesContent(
    Problem, slug="reason-quotes-content", status=422, title="Reason quotes the content"
):
    """The reason repeats a run of 3 or more consecutive words of the memory's value, or all
    the words of a shorter value (normalized; `_` separates words). A reason is kept with the
    revocation and shown to those who manage it, so it may not carry the content it takes
    down: say why, not what. Nothing changed."""


class MemoryAlreadyHidden(
    Problem, slug="memory-already-hidden", status=409, title="Memory already hidden"
):
    """The memory is revoked already, or hidden by the revocation of another memory
    (`revoked_memory_ids`, those you may manage). Nothing changed."""


class MemoryNotRevoked(Problem, slug="memory-not-revoked", status=409, title="Memory not revoked"):
    """The memory is not revoked or hidden: there is nothing to reinstate. Nothing changed."""


class NotTheRevokedMemory(
    Problem, slug="not-the-revoked-memory", status=409, title="Not the revoked memory"
):
    """The memory is hidden because another memory was revoked (it has the same content, or
    derives from it). Only reinstating that memory brings it back: `reinstate` lists the ids
    (those you may manage). Nothing changed."""
