"""Erasure with proof: plan, execute, receipt and proof (docs/erasure.md)."""
