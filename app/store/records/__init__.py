"""Recording updates: `roles` (what users may ask), `statements` (the SQL), `methods` (the
store's methods over them), `conformance` (the rules any store must keep)."""
