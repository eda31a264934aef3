"""What operators read (one update, counts, search, history, activity, audit log): `roles`,
`statements`, `methods`; their rules are in `app.store.conformance.control`."""
