"""The one conformance check for update stores, shipped so a custom store can be checked too:
`app.store.conformance.check.check_update_store`. Each family keeps its rules beside its
statements (`app.store.<family>.conformance`); `_core` holds what they share; `access` the
rules of who may see what."""
