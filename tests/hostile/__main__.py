"""`python -m tests.hostile`: the full hostile-input campaign (minutes) against `serve` on
SQLite and on PostgreSQL, with the service's default limits; prints one table per backend."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import psycopg

from tests.conftest import BACKENDS, POSTGRES_URL, Storage, _libpq
from tests.hostile.campaign import FULL, run, start_target, table

# The service's defaults (app.config): the campaign runs against them.
HEADER_TIMEOUT, BODY_TIMEOUT = 10.0, 30.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.hostile", description=__doc__)
    parser.add_argument("--backend", choices=BACKENDS, action="append")
    args = parser.parse_args()
    for backend in args.backend or BACKENDS:
        admin = (
            psycopg.connect(_libpq(POSTGRES_URL), autocommit=True)
            if backend == "postgresql"
            else None
        )
        with tempfile.TemporaryDirectory() as directory:
            storage = Storage(backend, Path(directory), admin)
            target = start_target(Path(directory), storage.url())
            try:
                rows = run(target, FULL, HEADER_TIMEOUT, BODY_TIMEOUT)
                print(table(backend, rows), flush=True)
            finally:
                target.process.kill()
                storage.drop()
                if admin is not None:
                    admin.close()


if __name__ == "__main__":
    main()
