"""Recording updates: `roles` (what users may ask), `statements` (the SQL), `methods` (the
store's methods over them). Its conformance rules: `app.store.conformance.records`."""
