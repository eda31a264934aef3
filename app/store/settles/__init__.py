"""Settling attempts: `roles`, `statements`, `methods`, `conformance`."""
