"""The key ring `run` keeps for its own SQLite file, so the embedded default is encrypted at
rest from its first start with nothing to configure.

Two files beside the database file, never inside it: `<database>.keys` (the text of
INTAKE_ENCRYPTION_KEYS) and `<database>.index-key` (the text of INTAKE_INDEX_KEY), each
created with mode 0600. Every command on that SQLite file without a ring of its own reads
them, so `telegram-intake updates` opens what `run` sealed. Keep them out of the database's
backups, or the backup carries its key (docs/privacy.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from app.privacy.keyring import KeyRing, new_key_text, parse_index_key, parse_keys, read_secret_file


def database_file(url: str) -> Path | None:
    """The file of a SQLite URL; None for PostgreSQL or an in-memory database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def key_files(database: Path) -> tuple[Path, Path]:
    return database.with_name(database.name + ".keys"), database.with_name(
        database.name + ".index-key"
    )


def read_own_ring(url: str) -> KeyRing | None:
    """The ring `run` made for this SQLite database, when it made one."""
    database = database_file(url)
    if database is None:
        return None
    keys, index = key_files(database)
    if not keys.exists():
        return None
    return KeyRing(
        parse_keys(read_secret_file(keys, str(keys)), str(keys)),
        parse_index_key(read_secret_file(index, str(index)), str(index)),
    )


def make_own_ring(url: str) -> tuple[KeyRing, Path] | None:
    """A new ring for this SQLite database, written beside it (mode 0600), and where; None
    when the URL names no SQLite file. Never overwrites: a file already there is read."""
    database = database_file(url)
    if database is None:
        return None
    keys, index = key_files(database)
    database.parent.mkdir(parents=True, exist_ok=True)
    key_text, index_text = new_key_text()
    for path, text in ((index, index_text), (keys, key_text)):  # the ring's file last: complete
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text + "\n")
            file.flush()
            os.fsync(file.fileno())
    ring = read_own_ring(url)
    assert ring is not None
    return ring, keys
