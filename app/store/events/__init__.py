"""Operational events: the outbox written by the transactions that make them, its delivery,
and the backlog and getWebhookInfo watches: `roles`, `statements`, `methods`, `conformance`."""
