"""Problems of consolidation."""

from __future__ import annotations

from service.problems import Problem


class SummarizerFailed(
    Problem, slug="summarizer-failed", status=503, title="Summarizer unavailable"
):
    """The summarizer endpoint could not be reached, kept failing after retries, or answered
    something that is not a usable summary. The batch wrote nothing; it is safe to run again."""

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "30"}
