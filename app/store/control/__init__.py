"""Operator control (pause, rate limits, the breaker, park, the audit entry): `roles`,
`statements`, `methods`, `conformance` (which covers the operators' views too)."""
