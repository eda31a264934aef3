"""The console's server-side sessions (revision 0005): `roles`, `statements`, `methods`; their
rules are in `app.store.conformance.access`."""
