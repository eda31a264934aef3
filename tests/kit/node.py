"""The TypeScript kit (kit/typescript) made ready for the tests: its npm dependencies installed
from package-lock.json (`npm ci`, from the npm registry, once per change of the lock) and its
sources and tests compiled. xdist's workers share the folder, so one at a time: a file lock.

Without Node 20 and npm the tests that need them fail under CI and skip elsewhere
(`tests.processes.unavailable`).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.processes import ROOT, unavailable

KIT = ROOT / "kit" / "typescript"
BOTS = KIT / "dist-test" / "test" / "bots"
INSTALLED = KIT / "node_modules" / ".installed-from"  # the lock's hash npm ci installed from


def tools() -> tuple[str, str]:
    """node and npm, version 20 or later."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("Node 20 and npm are needed for the TypeScript kit (nodejs.org)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    if int(version.stdout.strip().lstrip("v").split(".")[0]) < 20:
        unavailable(f"the TypeScript kit needs Node 20 or later, not {version.stdout.strip()}")
    return node, npm


@contextmanager
def one_at_a_time() -> Iterator[None]:
    with (KIT / ".tests.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def npm(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`npm <args>` in the kit's folder; a failure says what npm said."""
    _, program = tools()
    done = subprocess.run(
        [program, *args], cwd=KIT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"npm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def installed() -> None:
    """node_modules as package-lock.json says, installed when the lock changed."""
    wanted = hashlib.sha256((KIT / "package-lock.json").read_bytes()).hexdigest()
    if INSTALLED.is_file() and INSTALLED.read_text() == wanted:
        return
    npm("ci", "--no-audit", "--no-fund")
    INSTALLED.write_text(wanted)


def built() -> Path:
    """The kit and its tests compiled (dist-test/); returns the folder of the test bots."""
    with one_at_a_time():
        installed()
        npm("exec", "--", "tsc", "-p", "tsconfig.test.json")
    return BOTS


def node_bot(name: str) -> list[str]:
    """The command that runs the TypeScript test bot `name` (grammy, telegraf)."""
    node, _ = tools()
    return [node, str(built() / f"{name}.js")]
