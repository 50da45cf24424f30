"""Memories: learn (write, supersede), recall (get, list, search), forget (delete)."""
