"""Settling attempts: `roles`, `statements`, `methods`. Its conformance rules:
`app.store.conformance.settles`."""
