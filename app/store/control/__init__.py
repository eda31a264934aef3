"""Operator control (pause, rate limits, the breaker, park): `roles`, `statements`, `methods`.
Its conformance rules, the operators' views' too: `app.store.conformance.control`."""
