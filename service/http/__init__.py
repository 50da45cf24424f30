"""Cross-cutting HTTP: dependencies, problem mapping, health, request context."""
