"""Operational events: their delivery from the outbox (`app.store.outbox`), and the backlog
and getWebhookInfo watches: `roles`, `statements`, `methods`. Its conformance rules:
`app.store.conformance.events`."""
