"""The consolidation job's operation (its batches are audited under this name)."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.consolidation.problems import SummarizerFailed
from service.embeddings.base import EmbeddingFailed, EmbeddingInvalid
from service.operations import operation
from service.quotas.problems import QuotaExceeded

CONSOLIDATE = operation(
    "memory.consolidate",
    "consolidateMemories",
    "Summarize each subject's memories per space and audience (a job: run it through the "
    "job runner)",
    Scope.RUN_JOBS,
    SummarizerFailed,
    EmbeddingInvalid,
    EmbeddingFailed,
    QuotaExceeded,
)
