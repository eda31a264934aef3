"""Claiming updates under a lease, in Telegram's order (`chat_order`): `roles`, `statements`,
`methods`. Its conformance rules: `app.store.conformance.claims`."""
