"""memory.consolidate: per-scope summaries that inherit the most restrictive scope of their
inputs (promise 6), re-derived when their inputs change (docs/jobs.md)."""
