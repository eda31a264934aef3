"""An earlier release of the service, from the repository's history, as its own importable tree,
and what the rolling-upgrade tests share to run it beside this one: each process's environment
(`PYTHONPATH` set to the tree for the old release) and the client that posts to both."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.processes import ROOT, environment

# A downstream holds a queue's head through the upgrade: attempts are never spent, no breaker
# opens, and the retries come quickly.
HOLDING = {"max_attempts": 1000, "breaker_failures": 0, "retry_cap_seconds": 0.1}


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


def fleet_environment(url: str, hook: str, old_tree: Path) -> Callable[..., dict[str, str]]:
    """`env(release, **options)`: a process's environment, for release "old" (run from
    `old_tree`) or "new" (this tree), on `url` delivering to `hook`, with `HOLDING`."""

    def env(release: str, **options: object) -> dict[str, str]:
        made = environment(url, hook, **HOLDING, **options)
        if release == "old":
            made["PYTHONPATH"] = str(old_tree)
        return made

    return env


def fleet_client() -> httpx.AsyncClient:
    """The client that posts updates to the old and the new `serve`. It lets an idle
    connection go after 1 s, well inside the servers' 5 s keep-alive
    (INTAKE_KEEP_ALIVE_SECONDS). Its default (5 s) reused the old serve's connection after the
    upgrade's long pause just as the server closed it, and the POST met the close
    (httpx.ReadError, seen once on a busy machine)."""
    return httpx.AsyncClient(timeout=10, limits=httpx.Limits(keepalive_expiry=1.0))
