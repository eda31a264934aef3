"""What differs between SQLite and PostgreSQL, behind `backend.Backend`: each database's
statements (`*_statements`), engine (`*_engine`) and backend (`sqlite`, `postgres`;
`sqlite_writer`, SQLite's one writer thread). No other module of the store names a dialect."""
