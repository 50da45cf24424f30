"""`embeddings.reembed`: after a change of embedding model, give every version of a tenant a
vector of the configured model (docs/jobs.md, "embeddings.reembed").

A row records the model that made its vector (`embedding_model`, `provider/model@dimensions`,
`model_tag`). A batch takes the next `size` versions (by id, from the run's cursor) whose tag
is not the configured model's, embeds their values and stores the vectors and the new tag in
place, in one statement. While a run is half done, searches keep working: a vector leg ranks
only rows of the query's model, and the rows still on the old one are found by the lexical
leg (service/memory/repository.py `MemoryFilters.vector_conditions`).

No transaction waits for the provider: when the batch's call has not begun one, the read of
the stale rows ends its transaction (giving the connection back) before the provider is asked,
and the write begins a new one, which names the job principal again. A row changed meanwhile
(retracted, or re-embedded by another run) is left alone: the write matches each row's content
hash and old tag. A dry run counts the batch's stale rows and embeds nothing.
"""

from __future__ import annotations

from service.db.models import EMBEDDING_DIMENSIONS
from service.embeddings.base import Embedder, EmbeddingDimensionsMismatch, model_tag
from service.jobs.declare import Batch, BatchDone
from service.memory import repository
from service.memory.aging import parse_cursor
from service.policy.visible import Action, visible


def check_fits(embedder: Embedder) -> None:
    """Refuse a model whose vectors the column cannot hold (the service refuses to start
    with one too; a run built another way gets the same answer)."""
    if embedder.dimensions != EMBEDDING_DIMENSIONS:
        raise EmbeddingDimensionsMismatch(
            f"The configured embedding model {embedder.model_id} makes {embedder.dimensions}-"
            f"dimensional vectors; the schema stores {EMBEDDING_DIMENSIONS}. Re-embedding "
            "cannot change the column's size: configure a model of that size, or migrate the "
            "column first (docs/jobs.md). Nothing was changed."
        )


async def reembed_batch(batch: Batch) -> BatchDone:
    embedder = batch.runtime.embedder
    check_fits(embedder)
    model = model_tag(embedder)
    # Write (which includes read): only rows the job principal could write itself.
    scope = visible(batch.principal, Action.WRITE)
    session = batch.call.db
    began_before = session.in_transaction()
    stale = await repository.stale_embeddings(
        session,
        scope,
        model,
        after=parse_cursor(batch.cursor),
        size=batch.size,
        space_id=batch.scope.space_id,
    )
    done = len(stale) < batch.size
    cursor = None if done else str(stale[-1].id)
    if batch.scope.dry_run or not stale:
        return BatchDone(counts={"stale": len(stale)}, cursor=cursor)
    if not began_before:
        # Nothing of the runner's is in this transaction: end it before the provider answers.
        await batch.call.release()
    vectors = await embedder.embed([row.value for row in stale])
    updated = await repository.set_embeddings(
        session, scope, model, list(zip(stale, vectors, strict=True))
    )
    batch.call.facts.add_targets(updated)
    batch.call.facts.count(len(updated))
    return BatchDone(
        counts={"stale": len(stale), "reembedded": len(updated)},
        cursor=cursor,
    )
