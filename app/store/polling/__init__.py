"""Long polling: one poller of a bot across every process, and the batches it records:
`roles`, `statements`, `methods`. Its conformance rules: `app.store.conformance.polling`."""
