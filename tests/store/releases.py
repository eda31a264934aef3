"""An earlier release of the service, from the repository's history, as its own importable tree:
what the rolling-upgrade tests run beside this one (`PYTHONPATH` set to the tree)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.processes import ROOT


def release_tree(tmp_path: Path, commit: str, label: str) -> Path:
    """`app`, `alembic` and `alembic.ini` of `commit`, unpacked under `tmp_path`; a failure
    names the commit and what the test needs."""
    tree = tmp_path / label
    tree.mkdir()
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "app", "alembic", "alembic.ini"],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise AssertionError(
            f"this test runs {label} ({commit}) from the repository's history; it needs git "
            f"and a clone that holds that commit: {error}"
        ) from error
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree
