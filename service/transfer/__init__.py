"""`memgate import` and `memgate export`: moving memories in and out of a running server over
its HTTP API (JSONL, streaming, resumable). docs/import-export.md describes the formats."""
