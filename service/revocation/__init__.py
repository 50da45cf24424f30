"""Revoke and reinstate (issue 15, promise 7): a revoked fact never reaches a reader again."""
